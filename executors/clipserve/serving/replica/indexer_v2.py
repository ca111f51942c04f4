"""CLIPIndexer for DocArray v2: the v1 indexer's endpoints (indexer.py) over typed documents (jina/schemas.py).

`ClipDoc` in `/index`, `/update`, `/delete`; `ClipQuery` in and out of `/search`, each query's matches
`ClipMatch`es with `scores[<metric>]`; `/status` answers one `ReadyReport`-shaped document per shard. Endpoint
annotations are real types (Jina builds each endpoint's schema from them): no postponed annotations here.
"""

from typing import Optional

from clipserve.serving.jina.api import requests
from clipserve.serving.jina.compat import install_pydantic_compat, install_reduce_hook
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT
from clipserve.serving.jina.schemas import ClipDocs, ClipMatch, ClipMatches, ClipQueries, ReadyReport, ReadyReports
from clipserve.serving.replica import documents_v2
from clipserve.serving.replica import search as common

install_pydantic_compat()


class CLIPIndexer(common.IndexerBase):
    """Stores typed documents' embeddings, ids, texts, URLs and tags; finds the nearest for queries."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        documents_v2.check_roots(self.settings.access_paths, 'access_paths (indexer setting)')

    @requests
    def passes(self, docs: ClipDocs, **kwargs) -> ClipDocs:
        """Every other endpoint (`/encode`, `/rank/<model>`, ...) passes through unchanged, as a v1 executor without
        a handler lets it: Jina's v2 gateway refuses to chain an executor behind the encoder on an endpoint the
        next one neither binds nor catches."""
        return docs

    @requests(on=READY_ENDPOINT)
    def ready(self, docs: ReadyReports, **kwargs) -> ReadyReports:
        return documents_v2.ready_report(self.shard_id, self.shards, False)

    @requests(on=INFO_ENDPOINT)
    def info(self, docs: ClipDocs, **kwargs) -> ClipDocs:  # returns a dict: the docs pass unchanged
        return {'indexer': self.status_tags()}

    @requests(on='/index')
    def index(self, docs: ClipDocs, parameters: Optional[dict] = None, **kwargs) -> ClipDocs:
        self.store.upsert(common.points_of(documents_v2.views(docs), self.settings.max_stored_uri_bytes))
        return docs

    @requests(on='/update')
    def update(self, docs: ClipDocs, parameters: Optional[dict] = None, **kwargs) -> ClipDocs:
        found = self.store.update(common.points_of(documents_v2.views(docs), self.settings.max_stored_uri_bytes))
        error = common.missing_error(parameters, [str(d.id) for d in docs], found)
        if error is not None:
            raise error
        return docs

    @requests(on='/delete')
    def delete(self, docs: ClipDocs, parameters: Optional[dict] = None, **kwargs) -> ClipDocs:
        self.store.delete(common.delete_ids(docs, parameters))
        return docs

    @requests(on='/search')
    def search(self, docs: ClipQueries, parameters: Optional[dict] = None, **kwargs) -> ClipQueries:
        options = common.search_options(parameters, self.settings)
        documents_v2.check_roots(options.access_paths)
        if not len(docs):
            return docs
        for query, found in zip(docs, common.found_matches(self.store, docs, options)):
            matches = [
                ClipMatch(id=hit.id, text=hit.text, url=hit.uri, tags=hit.tags, scores={hit.score_name: hit.score})
                for hit in found
            ]
            query.matches = ClipMatches(matches)
        return docs

    @requests(on='/status')
    def status(self, docs: ClipDocs, **kwargs) -> ReadyReports:
        return ReadyReports([ReadyReport(id=f'{common.STATUS_ID}{self.shard_id}', tags=self.status_tags())])

    @requests(on='/clear')
    def clear(self, docs: ClipDocs, **kwargs) -> ClipDocs:
        self.store.clear()
        return docs


# ---- a head merging the shards' answers to /search ----------------------------------------------------


def merge_shards(docs, parameters: dict):
    """The head's hook (jina_compat.install_reduce_hook): v2 queries' matches from every shard, sorted by the
    indexer's score (MaxSim: larger first; a distance: smaller first) and cut to the request's `limit`.
    (v2 endpoints answer documents, not the SEARCH_RESULT the v1 indexer returns: the request's own limit,
    else the indexer's default of 10, decides.)"""
    if not docs or not hasattr(docs[0], 'matches'):
        return None
    scored = [q for q in docs if q.matches and all(getattr(m, 'scores', None) for m in q.matches)]
    if not scored:
        return None
    name = next(iter(scored[0].matches[0].scores))
    limit = int((parameters or {}).get('limit') or 10)
    result = {'score': name, 'limit': limit, 'descending': name == 'maxsim'}
    common.merge_matches(scored, result, lambda m, n: m.scores.get(n), _set_matches)
    return docs


def _set_matches(query, matches) -> None:
    """The head deserializes answers with models Jina builds from the schema (other classes of the same shape):
    the matches are the query's own type's again, not one of those."""
    matches_type = type(query.matches) if query.matches is not None else ClipMatches
    item = getattr(matches_type, 'doc_type', ClipMatch)
    query.matches = matches_type([m if isinstance(m, item) else item(**dict(m)) for m in matches])


install_reduce_hook(merge_shards)
