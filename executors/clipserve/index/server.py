"""A Qdrant server or cluster by URL, through qdrant-client: for collections past one machine.

The same collection settings as the embedded index (store.py), so moving an index means pointing
`qdrant_url` at a server. The server builds its graphs itself (no optimize here) and keeps its own write-ahead
log; a write returns once the server has applied it (`wait=True`). qdrant-client's in-process modes
(`:memory:`, `local:<folder>`: exhaustive search in Python, the same API) are accepted for tests and tiny
collections; no Qdrant server runs in clipserve's CI, which tests this path in those modes.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from clipserve.errors import VectorStoreError
from clipserve.index.points import Hit, Point, hit_from, point_id
from clipserve.index.store import METRICS, CollectionSettings, VectorStore, page_metric, public_settings, vector_kind

LOCAL_PREFIX = 'local:'


def _client_module():
    try:
        from qdrant_client import QdrantClient, models
    except ImportError as error:
        raise VectorStoreError(
            f'a Qdrant server needs qdrant-client: pip install "clipserve[search]" ({error})'
        ) from None
    return QdrantClient, models


def connect(url: str, api_key: str | None = None, timeout: float = 30.0):
    """A QdrantClient for `url` (http(s)://..., `:memory:` or `local:<folder>`)."""
    QdrantClient, _ = _client_module()
    try:
        if url == ':memory:':
            return QdrantClient(location=':memory:')
        if url.startswith(LOCAL_PREFIX):
            return QdrantClient(path=url[len(LOCAL_PREFIX) :])
        return QdrantClient(url=url, api_key=api_key, timeout=int(timeout))
    except Exception as error:
        raise VectorStoreError(f'cannot connect to the Qdrant at {url}: {error}') from None


class ServerStore(VectorStore):
    """One collection of a Qdrant server (or of qdrant-client's in-process modes)."""

    def __init__(self, url: str, collection: str, settings: CollectionSettings = CollectionSettings(), api_key=None):
        self.url = url
        self.collection = collection
        self.client = connect(url, api_key)
        self.settings = settings
        if self._guarded('read', lambda: self.client.collection_exists(collection)):
            self.settings = self._existing_settings(settings)
            self._exists = True
        else:
            self._exists = False

    def _existing_settings(self, given: CollectionSettings) -> CollectionSettings:
        info = self._guarded('read', lambda: self.client.get_collection(self.collection))
        vectors = info.config.params.vectors
        metric = {v: k for k, v in METRICS.items()}.get(str(getattr(vectors.distance, 'value', vectors.distance)))
        return replace(
            given,
            dim=int(vectors.size),
            metric=metric or given.metric,
            pages=vectors.multivector_config is not None,
        )

    # ---- writes ---------------------------------------------------------------------------------------

    def upsert(self, points: list[Point]) -> None:
        if not points:
            return
        size, page = vector_kind(points)
        if not self._exists:
            self._create(size, page)
        self.check_dim(size, page, self.settings.dim, self.settings.pages)
        _, models = _client_module()
        rows = [
            models.PointStruct(
                id=p.id, vector=np.asarray(p.vector, dtype=np.float32).tolist(), payload=p.full_payload()
            )
            for p in points
        ]
        self._guarded('upsert', lambda: self.client.upsert(self.collection, points=rows, wait=True))

    def update(self, points: list[Point]) -> list[str]:
        if not points or not self._exists:
            return []
        present = self._guarded('read', lambda: self.client.retrieve(self.collection, [p.id for p in points]))
        found = {str(r.id) for r in present}
        existing = [p for p in points if p.id in found]
        self.upsert(existing)
        return [p.document_id for p in existing]

    def delete(self, document_ids: list[str]) -> None:
        if document_ids and self._exists:
            _, models = _client_module()
            selector = models.PointIdsList(points=[point_id(i) for i in document_ids])
            self._guarded('delete', lambda: self.client.delete(self.collection, points_selector=selector, wait=True))

    def clear(self) -> None:
        if self._exists:
            self._guarded('clear', lambda: self.client.delete_collection(self.collection))
            self._exists = False
            self._create(self.settings.dim, bool(self.settings.pages))

    def _create(self, size: int, page: bool) -> None:
        _, models = _client_module()
        self.check_dim(size, page, self.settings.dim, self.settings.pages)
        self.settings = settings = replace(
            self.settings, dim=size, pages=page, metric=page_metric(self.settings.metric, page)
        )
        vectors = models.VectorParams(
            size=size,
            distance=getattr(models.Distance, METRICS[settings.metric].upper()),
            multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
            if page
            else None,
            quantization_config=models.ScalarQuantization(
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
            )
            if settings.quantization == 'int8'
            else None,
        )
        hnsw = models.HnswConfigDiff(m=settings.m, ef_construct=settings.ef_construct)
        self._guarded(
            'create', lambda: self.client.create_collection(self.collection, vectors_config=vectors, hnsw_config=hnsw)
        )
        for name, kind in settings.columns:
            schema = models.PayloadSchemaType.KEYWORD if kind == 'str' else models.PayloadSchemaType.FLOAT
            self._guarded(
                'index a column',
                lambda: self.client.create_payload_index(
                    self.collection, field_name=f'tags.{name}', field_schema=schema
                ),
            )
        self._exists = True

    # ---- reads ----------------------------------------------------------------------------------------

    def search(
        self, queries: list[np.ndarray], limit: int, filter_: dict | None = None, ef: int | None = None
    ) -> list[list[Hit]]:
        if not self._exists or not queries:
            return [[] for _ in queries]
        self.check_queries(queries)
        _, models = _client_module()
        condition = models.Filter(**filter_) if filter_ else None
        rescore = (
            models.QuantizationSearchParams(rescore=True, oversampling=2.0)
            if self.settings.quantization != 'none'
            else None
        )
        params = models.SearchParams(hnsw_ef=ef or self.settings.ef_search, quantization=rescore)
        requests = [
            models.QueryRequest(
                query=np.asarray(q, dtype=np.float32).tolist(),
                limit=int(limit),
                filter=condition,
                params=params,
                with_payload=True,
            )
            for q in queries
        ]
        answers = self._guarded('search', lambda: self.client.query_batch_points(self.collection, requests=requests))
        return [[hit_from(p.id, p.score, p.payload) for p in answer.points] for answer in answers]

    def count(self, filter_: dict | None = None) -> int:
        if not self._exists:
            return 0
        _, models = _client_module()
        condition = models.Filter(**filter_) if filter_ else None
        answer = self._guarded('count', lambda: self.client.count(self.collection, count_filter=condition, exact=True))
        return int(answer.count)

    def status(self) -> dict:
        info = self._guarded('read', lambda: self.client.get_collection(self.collection)) if self._exists else None
        return {
            'engine': 'qdrant-server' if self.url.startswith('http') else 'qdrant-client-local',
            'url': self.url,
            'collection': self.collection,
            'count': self.count(),
            'indexed': int(getattr(info, 'indexed_vectors_count', 0) or 0) if info else 0,
            **public_settings(self.settings),
        }

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # closing is best effort
            pass

    def _guarded(self, what: str, call):
        try:
            return call()
        except VectorStoreError:
            raise
        except Exception as error:
            raise VectorStoreError(
                f'the Qdrant collection {self.collection!r} at {self.url} could not {what}: {error}'
            ) from None
