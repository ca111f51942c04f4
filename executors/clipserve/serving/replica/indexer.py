"""CLIPIndexer for DocArray v1: clip-as-service's search endpoints on Qdrant's engine (serving/replica/search.py).

Put it after a CLIPEncoder (flows/search.yml): the encoder's catch-all embeds whatever reaches `/index`
and `/search`, then the indexer stores or searches. Endpoints, as clip-as-service's AnnLiteIndexer had them:
`/index`, `/search` (`limit`, `filter`, `include_metadata`, `ef_search`), `/update` (existing documents
only), `/delete` (by the documents' ids, or `parameters.ids`), `/status` (one document per shard: count,
size, settings), `/clear`. Every other path passes through untouched, so `/encode` and `/rank` still reach
the encoder's answers. clip-client's `index()` and `search()` work unchanged.
"""

from __future__ import annotations

from clipserve.config.parameters import check_access_paths
from clipserve.serving.jina.api import requests
from clipserve.serving.jina.compat import install_reduce_hook
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT
from clipserve.serving.replica import search as common
from clipserve.serving.replica.documents import document, documents, ready_report, set_score


class CLIPIndexer(common.IndexerBase):
    """Stores documents' embeddings with their ids, texts, URIs and tags, and finds the nearest for queries."""

    def _selected(self, docs, parameters: dict | None):
        paths = (parameters or {}).get(
            'access_paths', (parameters or {}).get('traversal_paths', self.settings.access_paths)
        )
        return docs[check_access_paths('access_paths', paths)]

    @requests(on=READY_ENDPOINT)
    def ready(self, **kwargs):
        return ready_report(self.shard_id, self.shards, False)

    @requests(on=INFO_ENDPOINT)
    def info(self, **kwargs):
        return {'indexer': self.status_tags()}

    @requests(on='/index')
    def index(self, docs, parameters: dict | None = None, **kwargs):
        selected = self._selected(docs, parameters)
        self.store.upsert(common.points_of(selected, self.settings.max_stored_uri_bytes))

    @requests(on='/update')
    def update(self, docs, parameters: dict | None = None, **kwargs):
        selected = self._selected(docs, parameters)
        found = self.store.update(common.points_of(selected, self.settings.max_stored_uri_bytes))
        error = common.missing_error(parameters, [str(d.id) for d in selected], found)
        if error is not None:
            raise error

    @requests(on='/delete')
    def delete(self, docs, parameters: dict | None = None, **kwargs):
        self.store.delete(common.delete_ids(self._selected(docs, parameters), parameters))

    @requests(on='/search')
    def search(self, docs, parameters: dict | None = None, **kwargs):
        options = common.search_options(parameters, self.settings)
        queries = docs[options.access_paths]
        if not len(queries):
            return None
        for query, found in zip(queries, common.found_matches(self.store, queries, options)):
            matches = []
            for hit in found:
                match = document(hit.id, text=hit.text, uri=hit.uri, mime_type=hit.mime_type, tags=hit.tags)
                set_score(match, hit.score_name, hit.score, hit.score_name)
                matches.append(match)
            query.matches = documents(matches)
        return common.search_result(self.store.settings, options)

    @requests(on='/status')
    def status(self, **kwargs):
        return documents([document(f'{common.STATUS_ID}{self.shard_id}', tags=self.status_tags())])

    @requests(on='/clear')
    def clear(self, **kwargs):
        self.store.clear()


# ---- a head merging the shards' answers to /search ----------------------------------------------------


def score_of(match, name: str):
    """A v1 match's score named `name`, or None. A score of exactly 0 arrives without a value (docarray 0.21
    drops protobuf's zero values): present and empty is 0."""
    if name not in match.scores:
        return None
    value = match.scores[name].value
    return 0.0 if value is None else value


def set_matches(query, matches) -> None:
    query.matches = documents(matches)


def merge_shards(docs, parameters: dict):
    """The head's hook (jina_compat.install_reduce_hook): after Jina's reduce has concatenated the shards'
    matches, sort them and keep the top `limit`, when the shards were CLIPIndexers answering /search."""
    result = common.shards_search_result(parameters)
    if result is None:
        return None
    common.merge_matches(docs[result['access_paths']], result, score_of, set_matches)
    return docs


install_reduce_hook(merge_shards)  # in every process that loads the indexer: a Flow's heads are among them
