"""What the sync and async clients share: their settings and the requests they build, with nothing that waits."""

from __future__ import annotations

from pathlib import Path

from clipserve_client.connection import DEFAULT_SERVER, Settings
from clipserve_client.inputs import to_item
from clipserve_client.wire import SCORES, rank_body, search_body


class ClientBase:
    """A client of a clipserve gateway's OpenAI-compatible routes (its HTTP port).

    :param server: ``http(s)://host:port`` of the gateway's HTTP port (a trailing ``/v1`` is fine)
    :param token: the gateway's token, sent as ``Authorization: Bearer <token>``; default: the
        ``CLIPSERVE_AUTH_TOKEN`` environment variable
    :param ca_file: PEM file of the certificate authorities to trust for https, instead of the system's
    :param timeout: seconds one request may take (None: no limit); past it, ``APITimeoutError``
    :param retries: how often a request is sent again after 429, 502, 503, 504 or a connection failure
    :param backoff: seconds before the first retry, doubled for each next one (jittered, at most 10 s);
        a longer Retry-After from the server is honoured (up to 60 s)
    :param batch_size: inputs per request; a longer list is sent as several requests
    :param model: the model to ask for (any name ``models()`` lists); default: the server's default model
    :param fetch_urls: download http(s) image URLs here (True) or let the server fetch them (False: only
        where its operator allowed remote URIs)
    :param fetch_timeout: seconds to download one image URL
    :param max_fetch_bytes: the largest image the client downloads
    """

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        token: str | None = None,
        ca_file: str | Path | None = None,
        timeout: float | None = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 32,
        model: str | None = None,
        fetch_urls: bool = True,
        fetch_timeout: float = 10.0,
        max_fetch_bytes: int = 20 * 2**20,
    ):
        self._settings = Settings.make(
            server,
            token=token,
            ca_file=ca_file,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            batch_size=batch_size,
            model=model,
            fetch_urls=fetch_urls,
            fetch_timeout=fetch_timeout,
            max_fetch_bytes=max_fetch_bytes,
        )
        self._http = self._open()

    def _open(self):
        """The httpx client (sync or async) these settings configure."""
        raise NotImplementedError

    @property
    def server(self) -> str:
        return self._settings.url

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.server!r})'

    def _model(self, model: str | None) -> str | None:
        return model if model is not None else self._settings.model

    def _batch_size(self, batch_size: int | None) -> int:
        size = self._settings.batch_size if batch_size is None else batch_size
        if size < 1:
            raise ValueError(f'batch_size must be >= 1, got {size}')
        return size

    def _search_body(self, query, vector, top_k: int, filter, rerank, model) -> dict:
        """The /v1/search body; a query is read as `encode` reads an input (a text, a path, bytes, an image)."""
        item = None if query is None else to_item(query, 'query', self._settings.loader)
        return search_body(item, vector, top_k, filter, rerank, self._model(model))

    def _rank_body(self, query, documents, model: str | None, score: str) -> tuple[dict, int]:
        """The /v1/rank body (read on the caller's thread: a few items, no batching) and the document count."""
        if score not in SCORES:
            raise ValueError(f'score must be one of {", ".join(SCORES)}, got {score!r}')
        if isinstance(documents, (str, bytes, dict)) or not hasattr(documents, '__iter__'):
            raise TypeError(f'documents must be a list of texts or images, got {type(documents).__name__}')
        loader = self._settings.loader
        items = [to_item(document, f'document {i}', loader) for i, document in enumerate(documents)]
        if not items:
            raise ValueError('rank() needs at least one document')
        return rank_body(to_item(query, 'query', loader), items, self._model(model)), len(items)
