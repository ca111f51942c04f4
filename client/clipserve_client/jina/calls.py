"""How one Client call runs: inputs streamed in batches through one transport, answers applied in order,
the whole call bounded by its timeout. The Client (client.py) holds the settings and the public methods.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
from docarray import Document, DocumentArray
from jina.proto import jina_pb2
from jina.types.request.data import DataRequest

from clipserve_client.jina.answers import AnswerHandler
from clipserve_client.jina.errors import ServerError
from clipserve_client.jina.inputs import is_pil_image, to_content_document
from clipserve_client.jina.methods import Method, Results
from clipserve_client.jina.pipeline import make_batches, run_batches
from clipserve_client.jina.progress import ProgressBar
from clipserve_client.jina.retry import send_with_retry
from clipserve_client.jina.transports import open_transport


class _ClientTimeout:
    """The default of a call's `timeout`: the one given to the Client."""

    def __repr__(self) -> str:
        return "<the Client's timeout>"


CLIENT_DEFAULT = _ClientTimeout()
_END = object()


class CallRunner:
    """The machinery behind the Client's methods; the Client sets `_address`, `_token`, `_timeout`,
    `_retry`, `_loader`, `_ssl_context` and `_grpc_credentials`."""

    async def _call(
        self,
        method: Method,
        content,
        as_documents: Optional[bool],
        *,
        batch_size,
        show_progress,
        parameters,
        on_done,
        on_error,
        on_always,
        prefetch,
        timeout,
    ):
        """Stream `content` through `method`; `as_documents=None`: Documents in, Documents out."""
        _check_content(content, method.name)
        batch_size = 8 if batch_size is None else batch_size
        if batch_size < 1 or prefetch < 1:
            raise ValueError('batch_size and prefetch must be >= 1')
        values = iter(content)
        first = next(values, _END)
        if first is _END:  # nothing to send; clip-client's empty results
            return DocumentArray() if as_documents or isinstance(content, DocumentArray) else []
        if as_documents is None:
            as_documents = isinstance(content, DocumentArray) or isinstance(first, Document)
        parameters = dict(parameters or {})
        parameters.setdefault('drop_image_content', True)
        endpoint = method.endpoint(parameters)
        results = Results(as_documents, keep=on_done is None and on_always is None)
        progress = ProgressBar(method.name, len(content) if hasattr(content, '__len__') else None, show_progress)
        on_answer = AnswerHandler(method, results, progress, on_done, on_error, on_always)
        batches = make_batches(
            chain([first], values),
            method,
            endpoint=endpoint,
            parameters=parameters,
            batch_size=batch_size,
            loader=self._loader,
            as_documents=as_documents,
        )

        async def stream():
            with progress:
                async with self._transport() as transport:
                    await run_batches(
                        transport,
                        batches,
                        prefetch=prefetch,
                        retry=self._retry,
                        on_batch=lambda batch: results.add(batch.items),
                        on_answer=on_answer,
                    )

        await self._within(stream(), timeout, method.name)
        return results.value()

    async def _profile(self, content) -> dict[str, float]:
        empty = content is None or (isinstance(content, str) and not content)
        doc = Document() if empty else to_content_document(content, self._loader, 0)  # empty: the network alone
        request = DataRequest()
        request.header.exec_endpoint = '/'
        request.data.docs = DocumentArray([doc])

        async def exchange():
            async with self._transport() as transport:
                return await send_with_retry(transport, request, self._retry)

        started = time.perf_counter()
        response = await self._within(exchange(), CLIENT_DEFAULT, 'profile')
        roundtrip = (time.perf_counter() - started) * 1000
        if response.header.status.code >= jina_pb2.StatusProto.ERROR:
            raise ServerError(response)
        routes = response.routes
        if len(routes) < 2:
            raise ValueError('the answer carries no timings of the gateway and an executor')

        def span(route):
            return route.end_time.ToMilliseconds() - route.start_time.ToMilliseconds()

        server, model = span(routes[0]), span(routes[1])
        return {
            'Roundtrip': roundtrip,
            'Client-server network': roundtrip - server,
            'Server': server,
            'Gateway-CLIP network': server - model,
            'CLIP model': model,
        }

    def _transport(self):
        return open_transport(
            self._address, credentials=self._grpc_credentials, ssl_context=self._ssl_context, token=self._token
        )

    async def _within(self, coroutine, timeout, name: str):
        timeout = self._timeout if timeout is CLIENT_DEFAULT else timeout
        if timeout is None:
            return await coroutine
        try:
            return await asyncio.wait_for(coroutine, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f'{name}() did not finish within {timeout} s') from None


def _check_content(content, name: str) -> None:
    """Refuse a single input where an iterable of inputs belongs, as clip-client does for a str."""
    single = (str, bytes, bytearray, memoryview, Path, Document, Mapping)
    if isinstance(content, single) or _is_single_image(content):
        raise TypeError(
            f'{name}() takes an iterable of inputs, not a single {type(content).__name__}; '
            f'try .{name}([...]) with a list'
        )
    if not isinstance(content, Iterable):
        raise TypeError(f'{name}() takes an iterable of inputs, got {type(content).__name__}')


def _is_single_image(content) -> bool:
    if isinstance(content, np.ndarray):
        return content.ndim in (2, 3)  # one HxW or HxWxC image; a batch is N x H x W x C or a list
    return is_pil_image(content)
