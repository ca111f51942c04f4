"""Qdrant's engine in process (`qdrant-edge-py`): one EdgeShard in a folder, nothing to start.

The shard keeps a write-ahead log, so a write is durable once `upsert` returns (a killed process loses
nothing it acknowledged). New points are searched exhaustively until `optimize()` builds their HNSW graph;
that build holds the interpreter (qdrant-edge-py 0.9 does not release the GIL there), which is why the
indexer runs a store in a process of its own (worker.py). The collection's settings are kept next to the
shard (`collection.json`), so a reopened index keeps its size, kind and metric whatever the caller says.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from clipserve.errors import VectorStoreError
from clipserve.index.points import Hit, Point, hit_from, point_id
from clipserve.index.store import (
    METRICS,
    CollectionSettings,
    VectorStore,
    page_metric,
    public_settings,
    saved_settings,
    vector_kind,
)

SETTINGS_FILE = 'collection.json'
SHARD_FOLDER = 'shard'
#: unindexed points below this are searched exhaustively (fast enough); above it optimize() builds HNSW
FULL_SCAN_KB = 10_000


def _engine():
    try:
        import qdrant_edge
    except ImportError as error:  # the search extra is not installed
        raise VectorStoreError(
            f'the embedded index needs qdrant-edge-py: pip install "clipserve[search]" ({error})'
        ) from None
    return qdrant_edge


class EdgeStore(VectorStore):
    """One collection in `folder`: `folder/collection.json` (its settings) and `folder/shard/` (the engine's)."""

    def __init__(self, folder: str | Path, settings: CollectionSettings = CollectionSettings()):
        self.folder = Path(folder)
        self._check_writable()
        saved = self.folder / SETTINGS_FILE
        self.settings = _read_settings(saved, settings) if saved.exists() else settings
        self._shard = None
        if (self.folder / SHARD_FOLDER).exists():
            self._shard = self._guarded('open', lambda: _engine().EdgeShard.load(str(self.folder / SHARD_FOLDER)))

    # ---- writes ---------------------------------------------------------------------------------------

    def upsert(self, points: list[Point]) -> None:
        if points:
            self._write(points, 'upsert', None)

    def update(self, points: list[Point]) -> list[str]:
        if not points or self._shard is None:
            return []
        qe = _engine()
        present = self._guarded('read', lambda: self._shard.retrieve([p.id for p in points], False, False))
        found = {str(r.id) for r in present}
        existing = [p for p in points if p.id in found]
        if existing:
            self._write(existing, 'update', qe.UpdateMode.UpdateOnly)
        return [p.document_id for p in existing]

    def delete(self, document_ids: list[str]) -> None:
        if document_ids and self._shard is not None:
            operation = _engine().UpdateOperation.delete_points([point_id(i) for i in document_ids])
            self._guarded('delete', lambda: self._shard.update(operation))

    def clear(self) -> None:
        if self._shard is not None:
            self._guarded('close', self._shard.close)
            self._shard = None
        shutil.rmtree(self.folder / SHARD_FOLDER, ignore_errors=True)

    def _write(self, points: list[Point], what: str, mode) -> None:
        qe = _engine()
        size, page = vector_kind(points)
        if self._shard is None:
            self._create(size, page)
        self.check_dim(size, page, self.settings.dim, self.settings.pages)
        rows = [
            qe.Point(id=p.id, vector=np.asarray(p.vector, dtype=np.float32).tolist(), payload=p.full_payload())
            for p in points
        ]
        operation = qe.UpdateOperation.upsert_points(rows, update_mode=mode)
        self._guarded(what, lambda: self._shard.update(operation))

    def _create(self, size: int, page: bool) -> None:
        settings = self.settings
        self.check_dim(size, page, settings.dim, settings.pages)
        self.settings = settings = replace(settings, dim=size, pages=page, metric=page_metric(settings.metric, page))
        self._guarded(
            'write', lambda: _write_settings(self.folder / SETTINGS_FILE, settings)
        )  # first: a reopen reads it
        config = _edge_config(settings)
        self._shard = self._guarded(
            'create', lambda: _engine().EdgeShard.create(str(self.folder / SHARD_FOLDER), config)
        )
        for name, kind in settings.columns:
            self._index_column(name, kind)

    def _index_column(self, name: str, kind: str) -> None:
        qe = _engine()
        # numbers arrive as floats, whatever their declared type (filters.py)
        schema = qe.PayloadSchemaType.Keyword if kind == 'str' else qe.PayloadSchemaType.Float
        operation = qe.UpdateOperation.create_field_index(f'tags.{name}', schema)
        self._guarded('index a column', lambda: self._shard.update(operation))

    # ---- reads ----------------------------------------------------------------------------------------

    def search(
        self, queries: list[np.ndarray], limit: int, filter_: dict | None = None, ef: int | None = None
    ) -> list[list[Hit]]:
        if self._shard is None or not queries:
            return [[] for _ in queries]
        self.check_queries(queries)
        qe = _engine()
        quantized = (
            qe.QuantizationSearchParams(rescore=True, oversampling=2.0)
            if self.settings.quantization != 'none'
            else None
        )
        params = qe.SearchParams(hnsw_ef=ef or self.settings.ef_search, quantization=quantized)
        condition = edge_filter(filter_) if filter_ else None
        requests = [
            qe.QueryRequest(
                limit=int(limit),
                query=qe.Query.Nearest(np.asarray(q, dtype=np.float32).tolist()),
                with_payload=True,
                filter=condition,
                params=params,
            )
            for q in queries
        ]
        answers = self._guarded('search', lambda: self._shard.query_batch(qe.QueryBatchRequest(requests)))
        return [[hit_from(p.id, p.score, p.payload) for p in answer] for answer in answers]

    def count(self, filter_: dict | None = None) -> int:
        if self._shard is None:
            return 0
        qe = _engine()
        request = qe.CountRequest(exact=True, filter=edge_filter(filter_) if filter_ else None)
        return int(self._guarded('count', lambda: self._shard.count(request)))

    def status(self) -> dict:
        info = self._guarded('read', self._shard.info) if self._shard is not None else None
        return {
            'engine': 'qdrant-edge',
            'path': str(self.folder),
            'count': info.points_count if info else 0,
            'indexed': info.indexed_vectors_count if info else 0,
            'segments': info.segments_count if info else 0,
            **public_settings(self.settings),
        }

    def unindexed(self) -> int:
        """Points whose HNSW graph is not built yet (searched exhaustively until optimize())."""
        if self._shard is None:
            return 0
        info = self._guarded('read', self._shard.info)
        return max(0, info.points_count - info.indexed_vectors_count)

    def optimize(self) -> bool:
        return bool(self._shard is not None and self._guarded('optimize', self._shard.optimize))

    def close(self) -> None:
        if self._shard is not None:
            self._guarded('close', self._shard.close)
            self._shard = None

    # ---- helpers --------------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        probe = self.folder / '.clipserve-write-test'
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b'ok')
            probe.unlink()
        except OSError as error:
            raise VectorStoreError(
                f'the index folder {self.folder} cannot be written ({error.strerror or error}): give the executor '
                'a writable workspace or index_path (CLIPSERVE_INDEX_PATH)'
            ) from None

    def _guarded(self, what: str, call):
        """`call()`, its engine errors as VectorStoreError naming what was being done and where."""
        try:
            return call()
        except VectorStoreError:
            raise
        except Exception as error:  # the engine's own exception types
            raise VectorStoreError(f'the index at {self.folder} could not {what}: {error}') from None


def _edge_config(settings: CollectionSettings):
    qe = _engine()
    multivector = qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim) if settings.pages else None
    quantization = (
        qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, quantile=0.99, always_ram=True)
        if settings.quantization == 'int8'
        else None
    )
    vectors = qe.EdgeVectorParams(
        size=int(settings.dim),
        distance=getattr(qe.Distance, METRICS[settings.metric]),
        multivector_config=multivector,
        quantization_config=quantization,
        on_disk=True if quantization is not None else None,  # int8 searches in memory, rescores from disk
    )
    hnsw = qe.HnswIndexConfig(m=settings.m, ef_construct=settings.ef_construct, full_scan_threshold=FULL_SCAN_KB)
    return qe.EdgeConfig(vectors=vectors, hnsw_config=hnsw)


def edge_filter(condition: dict):
    """Qdrant's JSON filter (filters.py) as qdrant-edge's classes."""
    qe = _engine()
    if {'must', 'should', 'must_not', 'min_should'} & set(condition):
        parts = {k: [edge_filter(c) for c in condition.get(k) or ()] or None for k in ('must', 'should', 'must_not')}
        return qe.Filter(**parts)
    key = condition.get('key')
    if key is None:
        raise VectorStoreError(f'a filter condition needs a key: {condition!r}')
    if 'range' in condition:
        return qe.FieldCondition(key=key, range=qe.RangeFloat(**condition['range']))
    match = condition.get('match') or {}
    if 'value' in match:
        value = match['value']
        # qdrant-edge-py 0.9 reads a Python bool as an integer (True as 1), which matches no stored bool;
        # numpy's bool reaches its bool variant
        return qe.FieldCondition(key=key, match=qe.MatchValue(np.bool_(value) if isinstance(value, bool) else value))
    if 'any' in match:
        return qe.FieldCondition(key=key, match=qe.MatchAny(list(match['any'])))
    if 'except' in match:
        return qe.FieldCondition(key=key, match=qe.MatchExcept(list(match['except'])))
    raise VectorStoreError(f'a filter condition the embedded index cannot read: {condition!r}')


def _write_settings(path: Path, settings: CollectionSettings) -> None:
    path.write_text(json.dumps(public_settings(settings), indent=2))


def _read_settings(path: Path, given: CollectionSettings) -> CollectionSettings:
    """The settings an index was made with; the search-time ones (ef_search) stay the caller's."""
    try:
        kept = saved_settings(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as error:
        raise VectorStoreError(f'{path} cannot be read ({error}): is this a clipserve index?') from None
    return replace(kept, ef_search=given.ef_search)
