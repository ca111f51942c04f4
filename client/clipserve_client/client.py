"""The Client: clip-client's methods and return types, over clipserve_client's own transports."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Iterable, Optional

import numpy as np
from docarray import Document, DocumentArray
from jina.proto import jina_pb2
from jina.types.request.data import DataRequest

from clipserve_client.address import parse_address
from clipserve_client.answers import AnswerHandler, Callback
from clipserve_client.errors import ServerError
from clipserve_client.inputs import Loader, is_pil_image, to_content_document
from clipserve_client.methods import Encode, Index, Method, Rank, Results, Search
from clipserve_client.pipeline import make_batches, run_batches
from clipserve_client.progress import ProgressBar
from clipserve_client.retry import RetryPolicy, send_with_retry
from clipserve_client.sync import run_sync
from clipserve_client.tls import grpc_credentials, ssl_context
from clipserve_client.transports import open_transport


class _ClientTimeout:
    """The default of a call's `timeout`: the one given to the Client."""

    def __repr__(self) -> str:
        return "<the Client's timeout>"


_CLIENT_DEFAULT = _ClientTimeout()
_END = object()


class Client:
    """A client of a clipserve (or clip-as-service) Flow.

    :param server: ``grpc://``, ``grpcs://``, ``http://``, ``https://``, ``ws://`` or ``wss://`` + ``host:port``
    :param credential: ``{'Authorization': token}``; without it, the ``CLIP_AUTH_TOKEN`` environment variable.
        Sent as gRPC metadata ``authorization`` or HTTP/WebSocket header ``Authorization``.
    :param ca_file: PEM file of the certificate authorities to trust for TLS, instead of the system's
    :param timeout: default seconds a call may take in all (None: no limit); each call can override it
    :param retries: how often a batch is sent again after a transient connection failure
    :param backoff: seconds before the first retry; doubled for each next one (jittered, at most 10 s)
    :param fetch_timeout: seconds to download an image URL the client fetches itself
    :param max_fetch_bytes: the largest image the client downloads or decodes from a data: URI

    Calls are safe from several threads at once: each call opens its own connection.
    """

    def __init__(
        self,
        server: str,
        credential: Optional[dict] = None,
        *,
        ca_file: str | Path | None = None,
        timeout: Optional[float] = None,
        retries: int = 3,
        backoff: float = 0.5,
        fetch_timeout: float = 10.0,
        max_fetch_bytes: int = 20 * 2**20,
    ):
        self._address = parse_address(server)
        if ca_file is not None and not self._address.tls:
            raise ValueError(f'ca_file is for TLS; use grpcs://, https:// or wss:// instead of {self._address}')
        token = (credential or {}).get('Authorization') or os.environ.get('CLIP_AUTH_TOKEN')
        self._token = token or None
        self._timeout = timeout
        self._retry = RetryPolicy(retries=retries, backoff=backoff)
        self._loader = Loader(fetch_timeout=fetch_timeout, max_bytes=max_fetch_bytes)
        tls, grpc = self._address.tls, self._address.protocol == 'grpc'
        self._ssl_context = ssl_context(ca_file) if tls and not grpc else None
        self._grpc_credentials = grpc_credentials(ca_file) if tls and grpc else None

    @property
    def server(self) -> str:
        return str(self._address)

    def __repr__(self) -> str:
        return f'Client({self.server!r})'

    # ---- the calls ---------------------------------------------------------------------------

    def encode(
        self,
        content: Iterable,
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """Embed texts and images.

        :param content: an iterable of str, bytes, pathlib.Path, numpy HxWxC arrays, PIL images or Documents
        :param batch_size: inputs per request (default 8)
        :param show_progress: draw a progress bar on stderr
        :param parameters: sent to the executors; ``model_name`` picks the endpoint ``/encode/<model_name>``
        :param on_done: called with each successful answer (a jina DataRequest)
        :param on_error: called with each failed answer; without it a failed answer raises ServerError
        :param on_always: called with every answer
        :param prefetch: requests in flight at most
        :param timeout: seconds the whole call may take (default: the Client's)

        The other methods take the same arguments.

        :return: for inputs that are not Documents, a float32 ``np.ndarray`` of shape [N, D] in input
            order; for Documents, a DocumentArray of the same Document objects with ``.embedding`` set;
            None when ``on_done`` or ``on_always`` is given (the answers go to the callbacks only).
        """
        return run_sync(
            self.aencode(
                content,
                batch_size=batch_size,
                show_progress=show_progress,
                parameters=parameters,
                on_done=on_done,
                on_error=on_error,
                on_always=on_always,
                prefetch=prefetch,
                timeout=timeout,
            )
        )

    async def aencode(
        self,
        content: Iterable,
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """`encode`, awaitable."""
        return await self._call(
            Encode(),
            content,
            None,
            batch_size=batch_size,
            show_progress=show_progress,
            parameters=parameters,
            on_done=on_done,
            on_error=on_error,
            on_always=on_always,
            prefetch=prefetch,
            timeout=timeout,
        )

    def rank(
        self,
        docs: Iterable[Document],
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """Score each Document's ``.matches`` against it (``scores['clip_score']``, ``['clip_score_cosine']``).

        :return: a DocumentArray of the same Document objects, each with its own match objects
            re-ordered by ``clip_score``, descending, and scored.
        """
        return run_sync(
            self.arank(
                docs,
                batch_size=batch_size,
                show_progress=show_progress,
                parameters=parameters,
                on_done=on_done,
                on_error=on_error,
                on_always=on_always,
                prefetch=prefetch,
                timeout=timeout,
            )
        )

    async def arank(
        self,
        docs: Iterable[Document],
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """`rank`, awaitable."""
        return await self._call(
            Rank(),
            docs,
            True,
            batch_size=batch_size,
            show_progress=show_progress,
            parameters=parameters,
            on_done=on_done,
            on_error=on_error,
            on_always=on_always,
            prefetch=prefetch,
            timeout=timeout,
        )

    def index(
        self,
        content: Iterable,
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """Send documents to ``/index`` (the Flow needs an indexer). Ids are kept and must be unique.

        :return: a DocumentArray (the same objects for Document inputs) with ``.embedding`` set.
        """
        return run_sync(
            self.aindex(
                content,
                batch_size=batch_size,
                show_progress=show_progress,
                parameters=parameters,
                on_done=on_done,
                on_error=on_error,
                on_always=on_always,
                prefetch=prefetch,
                timeout=timeout,
            )
        )

    async def aindex(
        self,
        content: Iterable,
        *,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """`index`, awaitable."""
        return await self._call(
            Index(),
            content,
            True,
            batch_size=batch_size,
            show_progress=show_progress,
            parameters=parameters,
            on_done=on_done,
            on_error=on_error,
            on_always=on_always,
            prefetch=prefetch,
            timeout=timeout,
        )

    def search(
        self,
        content: Iterable,
        *,
        limit: int = 10,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """Send queries to ``/search`` with ``parameters['limit']`` (the Flow needs an indexer).

        :return: a DocumentArray of the queries (the same objects for Document inputs) with the
            server's ``.matches``.
        """
        return run_sync(
            self.asearch(
                content,
                limit=limit,
                batch_size=batch_size,
                show_progress=show_progress,
                parameters=parameters,
                on_done=on_done,
                on_error=on_error,
                on_always=on_always,
                prefetch=prefetch,
                timeout=timeout,
            )
        )

    async def asearch(
        self,
        content: Iterable,
        *,
        limit: int = 10,
        batch_size: Optional[int] = None,
        show_progress: bool = False,
        parameters: Optional[dict] = None,
        on_done: Callback = None,
        on_error: Callback = None,
        on_always: Callback = None,
        prefetch: int = 100,
        timeout=_CLIENT_DEFAULT,
    ):
        """`search`, awaitable."""
        parameters = {**(parameters or {}), 'limit': limit}
        return await self._call(
            Search(),
            content,
            True,
            batch_size=batch_size,
            show_progress=show_progress,
            parameters=parameters,
            on_done=on_done,
            on_error=on_error,
            on_always=on_always,
            prefetch=prefetch,
            timeout=timeout,
        )

    def profile(self, content='', *, show: bool = True) -> dict[str, float]:
        """Time one round trip of `content` (by default an empty Document: network only) through the Flow.

        :param show: also print the breakdown as a tree on stdout, as clip-client does
        :return: milliseconds for 'Roundtrip', 'Client-server network', 'Server', 'Gateway-CLIP network'
            and 'CLIP model'
        """
        report = run_sync(self._profile(content))
        if show:
            from clipserve_client.report import print_profile

            print_profile(report)
        return report

    # ---- how a call runs ---------------------------------------------------------------------

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
        response = await self._within(exchange(), _CLIENT_DEFAULT, 'profile')
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
        timeout = self._timeout if timeout is _CLIENT_DEFAULT else timeout
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
