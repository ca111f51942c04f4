"""Stream one call's batches: prepare the next batch off the event loop, keep at most `prefetch` requests
in flight, and hand each answer to `on_answer` in the calling task, so callbacks never run concurrently.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Iterator

from docarray import DocumentArray
from jina.types.request.data import DataRequest

from clipserve_client.jina.inputs import Loader, needs_fetch
from clipserve_client.jina.methods import Item, Method
from clipserve_client.jina.retry import RetryPolicy, send_with_retry

_FETCH_THREADS = 8


@dataclass
class Batch:
    items: list[Item]
    request: DataRequest


def make_batches(
    values: Iterator,
    method: Method,
    *,
    endpoint: str,
    parameters: dict,
    batch_size: int,
    loader: Loader,
    as_documents: bool,
) -> Iterator[Batch]:
    """Batches of prepared items; reading inputs (files, URLs, PNG encoding) happens here, lazily."""

    def make(position_value):
        return method.item(*position_value, loader, as_documents)

    position = 0
    while chunk := list(islice(values, batch_size)):
        positions = range(position, position + len(chunk))
        fetching = sum(needs_fetch(value) for value in chunk)
        if fetching > 1:  # download the batch's URLs in parallel
            with ThreadPoolExecutor(max_workers=min(fetching, _FETCH_THREADS)) as pool:
                items = list(pool.map(make, zip(positions, chunk)))
        else:
            items = [make(pair) for pair in zip(positions, chunk)]
        position += len(chunk)
        request = DataRequest()
        request.header.exec_endpoint = endpoint
        request.parameters = parameters
        request.data.docs = DocumentArray([item.wire for item in items])
        yield Batch(items, request)


async def run_batches(
    transport,
    batches: Iterator[Batch],
    *,
    prefetch: int,
    retry: RetryPolicy,
    on_batch: Callable[[Batch], None],
    on_answer: Callable[[Batch, DataRequest], None],
) -> None:
    async def send(batch: Batch):
        return batch, await send_with_retry(transport, batch.request, retry)

    in_flight: set[asyncio.Task] = set()
    try:
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            on_batch(batch)
            while len(in_flight) >= prefetch:
                in_flight = await _settle(in_flight, on_answer)
            in_flight.add(asyncio.create_task(send(batch)))
        while in_flight:
            in_flight = await _settle(in_flight, on_answer)
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)


async def _settle(in_flight: set, on_answer) -> set:
    """Wait for at least one request; handle what finished and return what is still in flight."""
    done, pending = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
    failures = [task.exception() for task in done]  # retrieves every outcome, so none is reported as lost
    try:
        for failure in failures:
            if failure is not None:
                raise failure
        for task in done:
            on_answer(*task.result())
    except BaseException:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    return pending
