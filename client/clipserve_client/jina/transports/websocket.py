"""WebSocket: one connection per call, requests sent as protobuf bytes and answers matched by request id.

If the connection drops, the requests waiting on it fail with RetryableError and the next send
opens a new connection.
"""

from __future__ import annotations

import asyncio

import aiohttp
from jina.excepts import BadServerFlow
from jina.types.request.data import DataRequest

from clipserve_client.jina.address import Address
from clipserve_client.jina.errors import RetryableError


class _Connection:
    def __init__(self, socket):
        self.socket = socket
        self.waiting: dict[str, asyncio.Future] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self):
        reason = ''
        try:
            while True:
                message = await self.socket.receive()
                if message.type == aiohttp.WSMsgType.BINARY:
                    response = DataRequest(message.data)
                    future = self.waiting.pop(response.header.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(response)
                elif message.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSING,
                    aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.ERROR,
                ):
                    reason = str(message.extra or '')
                    break
        finally:
            # the requests still waiting on this connection are sent again on a new one
            error = RetryableError(f'the WebSocket connection closed (code {self.socket.close_code}) {reason}'.strip())
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(error)
            self.waiting.clear()

    @property
    def open(self) -> bool:
        return not self.socket.closed and not self.reader.done()

    async def close(self, graceful: bool):
        if graceful:  # the closing handshake waits for the server, which a timed-out call must not
            await self.socket.close()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


class WebSocketTransport:
    def __init__(self, address: Address, ssl_context, token: str | None):
        self._address = address
        self._url = address.url('/')
        self._ssl = ssl_context if address.tls else None
        self._headers = {'Authorization': token} if token else None
        self._session = None
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self):
        connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else aiohttp.TCPConnector()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self

    async def __aexit__(self, exc_type, *exc_info):
        if self._connection is not None:
            await self._connection.close(graceful=exc_type is None)
        await self._session.close()  # closes the socket, if still open

    async def _connect(self) -> _Connection:
        async with self._lock:
            if self._connection is None or not self._connection.open:
                try:
                    socket = await self._session.ws_connect(
                        self._url, protocols=('bytes',), headers=self._headers, max_msg_size=0
                    )
                except aiohttp.ClientSSLError as err:
                    raise ConnectionError(
                        f'TLS with {self._address} failed: {err}. If the server uses a private '
                        'certificate authority, pass ca_file='
                    ) from err
                except aiohttp.WSServerHandshakeError as err:
                    if err.status in (502, 503, 504):
                        raise RetryableError(f'{self._url} answered HTTP {err.status}') from err
                    raise BadServerFlow(
                        f'{self._url} refused the WebSocket (HTTP {err.status}): is '
                        f'{self._address} a Jina WebSocket gateway?'
                    ) from err
                except aiohttp.ClientConnectionError as err:
                    raise RetryableError(f'{self._address} is unavailable: {err}') from err
                self._connection = _Connection(socket)
            return self._connection

    async def send(self, request):
        connection = await self._connect()
        request_id = request.header.request_id
        future = asyncio.get_running_loop().create_future()
        connection.waiting[request_id] = future
        try:
            if not connection.open:
                raise ConnectionResetError('the connection closed')
            await connection.socket.send_bytes(request.SerializeToString())
        except (ConnectionError, aiohttp.ClientConnectionError) as err:
            connection.waiting.pop(request_id, None)
            raise RetryableError(f'{self._address}: sending failed: {err}') from err
        try:
            return await future
        finally:
            connection.waiting.pop(request_id, None)
