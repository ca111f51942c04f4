"""The asyncio client: the same calls as Client, awaitable, with up to `max_concurrency` requests in flight.

Inputs are prepared (files read, URLs downloaded, arrays written as PNG) on a worker thread, so the event
loop never blocks on them; the answers are put back in input order whatever order they arrive in.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from clipserve_client.base import ClientBase
from clipserve_client.connection import DEFAULT_SERVER, answer_of, transport_error
from clipserve_client.errors import APIStatusError, shift_items
from clipserve_client.inputs import batches, check_many, prepare
from clipserve_client.progress import Progress, ProgressArg
from clipserve_client.retry import Attempts
from clipserve_client.wire import (
    EMBEDDINGS,
    MODELS,
    RANK,
    RERANK,
    SEARCH,
    Found,
    Model,
    Reranked,
    embeddings_body,
    read_embeddings,
    read_found,
    read_models,
    read_reranked,
    read_scores,
    rerank_body,
)


class AsyncClient(ClientBase):
    """Client's calls, awaitable (the parameters: ClientBase's, and `max_concurrency`: the requests in flight
    from this client at once, all calls together).

    Use it as an async context manager, or await ``aclose()``::

        async with AsyncClient('http://127.0.0.1:51001') as client:
            vectors = await client.encode(texts, batch_size=64)
    """

    def __init__(self, server: str = DEFAULT_SERVER, *, max_concurrency: int = 4, **options):
        if max_concurrency < 1:
            raise ValueError(f'max_concurrency must be >= 1, got {max_concurrency}')
        self._max_concurrency = max_concurrency
        self._slots = asyncio.Semaphore(max_concurrency)
        super().__init__(server, **options)

    def _open(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._settings.httpx_options())

    async def encode(
        self, inputs, *, model: str | None = None, batch_size: int | None = None, progress: ProgressArg = None
    ) -> np.ndarray:
        """Client.encode, awaitable: the batches are sent concurrently and returned in input order."""
        check_many(inputs, 'encode')
        size, model = self._batch_size(batch_size), self._model(model)
        results: dict[int, np.ndarray] = {}
        loader = self._settings.loader

        async def one(offset: int, chunk: list, bar: Progress) -> None:
            items = await asyncio.to_thread(prepare, chunk, offset, loader)
            answer = await self._request('POST', EMBEDDINGS, embeddings_body(items, model), offset)
            results[offset] = read_embeddings(answer, len(items))
            bar.advance(len(items))

        running: set[asyncio.Task] = set()
        with Progress(progress, len(inputs) if hasattr(inputs, '__len__') else None, 'encode') as bar:
            try:
                for offset, chunk in batches(inputs, size):
                    if len(running) >= self._max_concurrency:  # bounds the prepared batches held in memory
                        running = await _settle(running, asyncio.FIRST_COMPLETED)
                    running.add(asyncio.create_task(one(offset, chunk, bar)))
                while running:
                    running = await _settle(running, asyncio.FIRST_COMPLETED)
            finally:
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
        return np.concatenate([results[k] for k in sorted(results)]) if results else np.zeros((0, 0), np.float32)

    async def rank(self, query, documents, *, model: str | None = None, score: str = 'clip_score') -> np.ndarray:
        """Client.rank, awaitable."""
        body, count = await asyncio.to_thread(self._rank_body, query, documents, model, score)
        return read_scores(await self._request('POST', RANK, body), count, score)

    async def rerank(self, query: str, documents, *, model=None, top_n=None, max_length=None) -> list[Reranked]:
        """Client.rerank, awaitable."""
        body = rerank_body(query, documents, model, top_n, max_length)
        return read_reranked(await self._request('POST', RERANK, body), len(documents))

    async def search(self, query=None, *, vector=None, top_k=10, filter=None, rerank=None, model=None) -> list[Found]:
        """Client.search, awaitable."""
        body = await asyncio.to_thread(self._search_body, query, vector, top_k, filter, rerank, model)
        return read_found(await self._request('POST', SEARCH, body))

    async def models(self) -> list[Model]:
        """Client.models, awaitable."""
        return read_models(await self._request('GET', MODELS))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, body: dict | None = None, offset: int = 0) -> dict:
        attempts = Attempts(self._settings.retry)
        while True:
            try:
                async with self._slots:
                    return answer_of(await self._http.request(method, path, json=body))
            except httpx.HTTPError as error:
                failure = transport_error(error, self.server + path, self._settings.timeout)
            except APIStatusError as error:
                failure = shift_items(error, offset)
            await asyncio.sleep(attempts.failed(failure))


async def _settle(running: set, when) -> set:
    """Wait for tasks; raise the first failure among those that finished; return those still running."""
    done, pending = await asyncio.wait(running, return_when=when)
    for task in done:
        task.result()
    return pending
