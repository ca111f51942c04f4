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
from clipserve_client.inputs import batches, check_many, prepare, prepare_each
from clipserve_client.partial import Encoded, Pieces, gather
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

        with Progress(progress, len(inputs) if hasattr(inputs, '__len__') else None, 'encode') as bar:
            await self._run_batches(batches(inputs, size), one, bar)
        return np.concatenate([results[k] for k in sorted(results)]) if results else np.zeros((0, 0), np.float32)

    async def encode_partial(
        self, inputs, *, model: str | None = None, batch_size: int | None = None, progress: ProgressArg = None
    ) -> Encoded:
        """Client.encode_partial, awaitable: the batches are sent concurrently."""
        check_many(inputs, 'encode_partial')
        size, model = self._batch_size(batch_size), self._model(model)
        done: list[Pieces] = []
        loader = self._settings.loader

        async def one(offset: int, chunk: list, bar: Progress) -> None:
            pieces = Pieces(offset, await asyncio.to_thread(prepare_each, chunk, offset, loader))
            while (part := pieces.next()) is not None:
                try:
                    answer = await self._request('POST', EMBEDDINGS, embeddings_body(pieces.items_of(part), model))
                except APIStatusError as error:
                    pieces.refused(part, error)
                else:
                    pieces.answered(part, read_embeddings(answer, len(part)))
            done.append(pieces)
            bar.advance(len(chunk))

        with Progress(progress, len(inputs) if hasattr(inputs, '__len__') else None, 'encode') as bar:
            await self._run_batches(batches(inputs, size), one, bar)
        return gather(done)

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

    async def _run_batches(self, chunks, one, bar: Progress) -> None:
        """`one(offset, chunk, bar)` for each batch, at most `max_concurrency` at once (which also bounds the
        prepared batches held in memory); the first failure cancels the others and is raised."""
        running: set[asyncio.Task] = set()
        try:
            for offset, chunk in chunks:
                if len(running) >= self._max_concurrency:
                    running = await _settle(running, asyncio.FIRST_COMPLETED)
                running.add(asyncio.create_task(one(offset, chunk, bar)))
            while running:
                running = await _settle(running, asyncio.FIRST_COMPLETED)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

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
