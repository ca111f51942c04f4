"""The indexer's work, whatever the DocArray flavour: documents to points, a search's options, hits to matches.

clip-as-service's search contract (its AnnLiteIndexer): `/index` stores each document's embedding with its
id, text, URI, MIME type and tags; `/search` gives each query document its `limit` nearest documents as
matches, best first, each with `scores[<metric>]` as AnnLite gave it, a distance (cosine: 1 - cosine
similarity; inner_product: 1 - the product; euclidean: the distance); a late-interaction index scores by
MaxSim (`scores['maxsim']`, larger is closer). Documents read by attribute (`id`, `embedding`, `text`,
`uri`, `tags`, `mime_type`), so a v1 Document passes as it is and a v2 one through documents_v2.DocView.

Sharded (`shards: N`, `/search` polled ALL), each shard answers its own top `limit`; a head merges the shards'
matches (Jina's reduce concatenates them), and `merge_matches` then sorts them and keeps the top `limit`,
from what every shard's indexer returned as SEARCH_RESULT (jina_compat.install_search_merge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clipserve.config.indexer_settings import indexer_settings
from clipserve.config.parameters import check_access_paths, check_bool, check_int
from clipserve.errors import InvalidDocumentError, InvalidParameterError
from clipserve.index.filters import to_qdrant
from clipserve.index.points import Point
from clipserve.index.server import ServerStore
from clipserve.index.store import CollectionSettings, VectorStore
from clipserve.index.worker import StoreProcess
from clipserve.serving.jina.api import JINA_ARGUMENTS, Executor

#: the indexer's returned parameters (`__results__`) on /search: what a head needs to merge shards exactly
SEARCH_RESULT = 'clipserve_search'
INDEX_FOLDER = 'clipserve-index'
STATUS_ID = 'clipserve-index-status-shard-'  # one /status document per shard (a head merges documents by id)
MAX_LIMIT = 10_000


def collection_settings(settings) -> CollectionSettings:
    return CollectionSettings(
        dim=settings.n_dim,
        metric=settings.metric,
        m=settings.max_connection,
        ef_construct=settings.ef_construction,
        ef_search=settings.ef_search,
        quantization=settings.quantization,
        columns=tuple(settings.columns),
    )


def open_store(settings, workspace: str | None, shard_id: int, shards: int) -> VectorStore:
    """The store the settings name: a Qdrant server's collection, else the embedded index in its folder (a
    shard of a sharded indexer in its own)."""
    collection = collection_settings(settings)
    if settings.qdrant_url:
        name = settings.qdrant_collection + (f'_shard{shard_id}' if shards > 1 else '')
        return ServerStore(settings.qdrant_url, name, collection, settings.qdrant_api_key)
    if settings.index_path:
        folder = Path(settings.index_path) / (f'shard-{shard_id}' if shards > 1 else '')
    else:
        folder = Path(workspace or '.') / INDEX_FOLDER
    return StoreProcess(folder, collection, optimize_after=settings.optimize_after)


# ---- documents to points ----------------------------------------------------------------------------


def payload_of(doc, max_uri_bytes: int) -> dict:
    """What a match carries back: the document's text, URI (up to max_uri_bytes), MIME type and tags."""
    payload = {}
    if doc.text:
        payload['text'] = doc.text
    uri = doc.uri or ''
    if uri and len(uri) <= max_uri_bytes:
        payload['uri'] = uri
    if getattr(doc, 'mime_type', None):
        payload['mime_type'] = doc.mime_type
    tags = dict(doc.tags or {})
    if tags:
        payload['tags'] = tags
    return payload


def points_of(docs, max_uri_bytes: int) -> list[Point]:
    """A point per document; InvalidDocumentError naming those without an embedding (no encoder before the
    indexer, or one that could not encode them) or with a non-finite one."""
    points, failures = [], []
    for doc in docs:
        embedding = doc.embedding
        if embedding is None:
            failures.append((doc.id, 'has no embedding to index: put an encoder before the indexer, or send one'))
            continue
        vector = np.asarray(embedding, dtype=np.float32)
        if vector.size == 0 or not np.isfinite(vector).all():
            failures.append((doc.id, 'has an empty or non-finite embedding'))
            continue
        points.append(Point(str(doc.id), vector, payload_of(doc, max_uri_bytes)))
    if failures:
        raise InvalidDocumentError(failures, 'indexed')
    return points


def query_vectors(docs) -> list[np.ndarray]:
    failures = [
        (d.id, 'has no embedding to search with: put an encoder before the indexer')
        for d in docs
        if d.embedding is None
    ]
    if failures:
        raise InvalidDocumentError(failures)
    return [np.asarray(d.embedding, dtype=np.float32) for d in docs]


# ---- a search's options, and its scores -----------------------------------------------------------


@dataclass(frozen=True)
class SearchOptions:
    limit: int
    filter: dict | None
    ef: int | None
    include_metadata: bool
    access_paths: str


def search_options(parameters: dict | None, settings) -> SearchOptions:
    """A /search request's options from its parameters (clip-as-service's names; `traversal_paths` too), each
    checked: a wrong one is an InvalidParameterError naming it."""
    parameters = parameters or {}
    limit = check_int('limit', parameters.get('limit', settings.limit), minimum=1)
    if limit > MAX_LIMIT:
        raise InvalidParameterError(f"parameter 'limit' must be at most {MAX_LIMIT}, got {limit}")
    ef = parameters.get('ef_search')
    paths = parameters.get('access_paths', parameters.get('traversal_paths', settings.access_paths))
    include = parameters.get('include_metadata', settings.include_metadata)
    return SearchOptions(
        limit=limit,
        filter=to_qdrant(parameters.get('filter'), 'filter'),
        ef=None if ef is None else check_int('ef_search', ef, minimum=1),
        include_metadata=check_bool('include_metadata', include),
        access_paths=check_access_paths('access_paths', paths),
    )


def score_name(collection: CollectionSettings) -> str:
    return 'maxsim' if collection.pages else collection.metric


def match_score(collection: CollectionSettings, engine_score: float) -> float:
    """AnnLite's value for the engine's score: a distance (smaller is closer), except MaxSim (larger is)."""
    if collection.pages or collection.metric == 'euclidean':
        return float(engine_score)
    return 1.0 - float(engine_score)


@dataclass(frozen=True)
class Found:
    """One match of a search, whatever the flavour writes it as: its id, the stored fields (empty without
    include_metadata) and its score under its name."""

    id: str
    text: str | None
    uri: str | None
    mime_type: str | None
    tags: dict
    score_name: str
    score: float


def found_matches(store: VectorStore, queries, options: SearchOptions) -> list[list[Found]]:
    """Each query's matches, best first: the store's hits with AnnLite's scores and the stored fields."""
    collection = store.settings
    name = score_name(collection)

    def found(hit) -> Found:
        payload = hit.payload if options.include_metadata else {}
        fields = [payload.get(key) or None for key in ('text', 'uri', 'mime_type')]
        return Found(hit.document_id, *fields, payload.get('tags') or {}, name, match_score(collection, hit.score))

    hits = store.search(query_vectors(queries), options.limit, options.filter, options.ef)
    return [[found(hit) for hit in each] for each in hits]


def search_result(collection: CollectionSettings, options: SearchOptions) -> dict:
    """What this indexer returns for a head merging shards: the score to sort by, its order, the limit."""
    return {
        SEARCH_RESULT: {
            'score': score_name(collection),
            'descending': bool(collection.pages),
            'limit': options.limit,
            'access_paths': options.access_paths,
        }
    }


def shards_search_result(parameters: dict | None) -> dict | None:
    """The SEARCH_RESULT the shards' indexers returned (Jina keeps returned dicts under `__results__`,
    by executor name), or None when the answer is not a search's."""
    results = (parameters or {}).get('__results__') or {}
    for value in results.values():
        if isinstance(value, dict) and isinstance(value.get(SEARCH_RESULT), dict):
            return value[SEARCH_RESULT]
    return None


def merge_matches(queries, result: dict, score_of, set_matches) -> None:
    """Sort each query's matches (from every shard) by the indexer's score and keep the top `limit`;
    `score_of(match, name)` reads a match's score and `set_matches(query, matches)` writes them back, in the
    documents' flavour."""
    name, limit, descending = result['score'], int(result['limit']), bool(result['descending'])
    worst = -math.inf if descending else math.inf
    for query in queries:
        matches = list(query.matches or ())
        if not matches:
            continue

        def key(match):
            value = score_of(match, name)
            return worst if value is None else value

        set_matches(query, sorted(matches, key=key, reverse=descending)[:limit])


# ---- the executor both flavours' indexers are --------------------------------------------------------

#: the arguments Jina gives every executor; every other argument is an indexer setting


class IndexerBase(Executor):
    """What both flavours' indexers share: settings, the store, this copy's shard, /clipserve/info."""

    def __init__(self, **kwargs):
        super().__init__(**{k: kwargs.pop(k) for k in JINA_ARGUMENTS if k in kwargs})
        self.settings = indexer_settings(**kwargs)
        for warning in self.settings.warnings:
            self.logger.warning(warning)
        self.shard_id = int(getattr(self.runtime_args, 'shard_id', 0) or 0)
        self.shards = int(getattr(self.runtime_args, 'shards', 1) or 1)
        self.store = open_store(self.settings, self.workspace, self.shard_id, self.shards)
        status = self.store.status()
        self.logger.info(
            f'index ready: {status["count"]} documents in {status.get("path") or status.get("url")} '
            f'({status["engine"]}, {status.get("dim") or "size from the first documents"}, {status["metric"]})'
        )

    def status_tags(self) -> dict:
        return {**self.store.status(), 'shard_id': self.shard_id, 'shards': self.shards}

    def close(self) -> None:
        self.store.close()
        super().close()


def delete_ids(docs, parameters: dict | None) -> list[str]:
    ids = (parameters or {}).get('ids') or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise InvalidParameterError(f"parameter 'ids' must be a list of document ids, got {ids!r}")
    return [*ids, *(str(d.id) for d in docs)]


def missing_error(parameters: dict | None, asked: list[str], found: list[str]) -> InvalidDocumentError | None:
    """clip-as-service's `raise_errors_on_not_found`: an error naming the documents that were not there."""
    if not check_bool('raise_errors_on_not_found', (parameters or {}).get('raise_errors_on_not_found', False)):
        return None
    missing = sorted(set(asked) - set(found))
    return InvalidDocumentError([(i, 'is not in the index') for i in missing], 'updated') if missing else None
