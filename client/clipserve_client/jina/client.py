"""The Client: clip-client's methods and return types, over clipserve_client.jina's own transports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional

from docarray import Document

from clipserve_client.jina.address import parse_address
from clipserve_client.jina.answers import Callback
from clipserve_client.jina.calls import CLIENT_DEFAULT, CallRunner
from clipserve_client.jina.inputs import Loader
from clipserve_client.jina.methods import Encode, Index, Rank, Search
from clipserve_client.jina.retry import RetryPolicy
from clipserve_client.jina.sync import run_sync
from clipserve_client.jina.tls import grpc_credentials, ssl_context

_CLIENT_DEFAULT = CLIENT_DEFAULT


class Client(CallRunner):
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
            A late-interaction model (ColPali, ColQwen2) answers only with ``parameters={'multi_vector': True}``
            and gives each input a [tokens, D] array: a list of them for inputs that are not Documents.
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
            from clipserve_client.jina.report import print_profile

            print_profile(report)
        return report
