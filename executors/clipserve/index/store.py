"""The one small interface every vector store implements, and the settings a collection is made with.

Two implementations: Qdrant's engine in process (edge.py, the default: nothing to run) and a Qdrant server
or cluster through qdrant-client (server.py). A collection's vector size and kind (one vector, or a page of
vectors compared by MaxSim) come from its settings or, when those leave them open, from the first points
written: an encoder's output decides them, not the operator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import numpy as np

from clipserve.errors import InvalidParameterError, VectorStoreError
from clipserve.index.points import Hit, Point

#: AnnLite's metric names and what each becomes in Qdrant
METRICS = {'cosine': 'Cosine', 'euclidean': 'Euclid', 'inner_product': 'Dot'}


@dataclass(frozen=True)
class CollectionSettings:
    """How a collection is built and searched (the indexer's settings: config/indexer_settings.py)."""

    dim: int | None = None  # None: the first points' size
    metric: str = 'cosine'
    m: int = 16  # HNSW edges per node (AnnLite's max_connection)
    ef_construct: int = 200  # HNSW candidates while building (AnnLite's ef_construction)
    ef_search: int = 128  # HNSW candidates while searching (AnnLite's ef_search / ef_query)
    quantization: str = 'none'  # or 'int8' (scalar quantization, originals kept for rescoring)
    pages: bool | None = None  # a page of vectors per point (late interaction); None: from the first points
    columns: tuple[tuple[str, str], ...] = ()  # (tag, 'str' | 'int' | 'float'): payload indexes for filters


#: the name operators see for `pages` (/status, an embedded index's collection.json): Qdrant's multivector
PAGES_KEY = 'multi_vector'


def public_settings(settings: CollectionSettings) -> dict:
    """The settings as /status shows them and an embedded index saves them (JSON: lists, the public names)."""
    out = asdict(settings)
    out[PAGES_KEY] = out.pop('pages')
    out['columns'] = [list(c) for c in settings.columns]
    return out


def saved_settings(saved: dict) -> CollectionSettings:
    """`public_settings` read back; TypeError or ValueError when it is not such a dict."""
    saved = dict(saved)
    saved['pages'] = saved.pop(PAGES_KEY, None)
    saved['columns'] = tuple(tuple(c) for c in saved.get('columns') or ())
    return CollectionSettings(**saved)


def page_metric(metric: str, page: bool) -> str:
    """A late-interaction (page) index compares by dot products: MaxSim is defined on them, as /rank computes
    it (engine/ranking.maxsim); a single-vector index keeps its metric."""
    return 'inner_product' if page else metric


def vector_kind(points: list[Point]) -> tuple[int, bool]:
    """(size, is a page of vectors) of the points being written; VectorStoreError if they disagree."""
    kinds = set()
    for point in points:
        vector = np.asarray(point.vector)
        if vector.ndim not in (1, 2) or vector.shape[-1] < 1:
            raise VectorStoreError(
                f'document {point.document_id!r}: an embedding must be a vector or a [tokens, dim] page, '
                f'got shape {vector.shape}'
            )
        kinds.add((int(vector.shape[-1]), vector.ndim == 2))
    if len(kinds) != 1:
        raise VectorStoreError(f'the documents carry embeddings of different sizes or kinds: {sorted(kinds)}')
    return kinds.pop()


class VectorStore(ABC):
    """A collection of points: write, delete, search by similarity (with a payload filter), count, clear."""

    settings: CollectionSettings

    @abstractmethod
    def upsert(self, points: list[Point]) -> None:
        """Add the points, replacing those with the same ids; durable when it returns."""

    @abstractmethod
    def update(self, points: list[Point]) -> list[str]:
        """Replace the points that exist (others are not added); the document ids that were there."""

    @abstractmethod
    def delete(self, document_ids: list[str]) -> None:
        """Remove these documents' points (ids that are not there are ignored)."""

    @abstractmethod
    def search(
        self, queries: list[np.ndarray], limit: int, filter_: dict | None = None, ef: int | None = None
    ) -> list[list[Hit]]:
        """The `limit` nearest points to each query (Qdrant's JSON filter, filters.py), best first."""

    @abstractmethod
    def count(self, filter_: dict | None = None) -> int: ...

    @abstractmethod
    def clear(self) -> None:
        """Remove every point; the collection keeps its settings."""

    @abstractmethod
    def status(self) -> dict:
        """What an operator wants to know: count, size, kind, settings, how much is indexed."""

    def optimize(self) -> bool:
        """Build what searches need (HNSW graphs) now; True if anything was built. Servers do it themselves."""
        return False

    def close(self) -> None:
        pass

    def check_queries(self, queries: list[np.ndarray]) -> None:
        """InvalidParameterError when a query's size (or kind) is not the collection's: a query embedded by
        another model than the one the index was built with."""
        settings = self.settings
        for query in queries:
            query = np.asarray(query)
            size, page = int(query.shape[-1]), query.ndim == 2
            if settings.dim is not None and size != settings.dim:
                raise InvalidParameterError(
                    f'the query is a {size}-dimensional embedding, the index holds {settings.dim}-dimensional ones: '
                    'search with the model the index was built with'
                )
            if settings.pages is not None and page != settings.pages:
                wanted = 'a page of vectors' if settings.pages else 'one vector'
                raise InvalidParameterError(f'the index holds {wanted} per document; the query is not that')

    def check_dim(self, size: int, page: bool, dim: int | None, pages: bool | None) -> None:
        """VectorStoreError when points of `size` (a page or not) cannot go into a collection of `dim`."""
        if dim is not None and size != dim:
            raise VectorStoreError(
                f'the documents carry {size}-dimensional embeddings, the index holds {dim}-dimensional ones: '
                'index with the model the index was built with, or into a new index (another path or collection)'
            )
        if pages is not None and page != pages:
            kinds = ('one vector per document', 'a page of vectors per document (late interaction)')
            raise VectorStoreError(f'the documents carry {kinds[page]}, the index holds {kinds[pages]}')
