"""gRPC: one unary `process_single_data` call per batch, multiplexed over one HTTP/2 channel.

The channel is grpc's thread-safe synchronous one, its call futures bridged into asyncio: grpc.aio
binds every event loop of the process to one global poller, and with loops in several threads (each
call here runs its own loop) it floods the logs with spurious BlockingIOErrors (grpc/grpc#25364).
"""

from __future__ import annotations

import asyncio

import grpc
from jina.excepts import BadServerFlow
from jina.proto import jina_pb2_grpc

from clipserve_client.jina.address import Address
from clipserve_client.jina.errors import RetryableError

_TLS_FAILURE_HINTS = ('handshake', 'certificate', 'ssl')
_OPTIONS = [
    ('grpc.max_send_message_length', -1),
    ('grpc.max_receive_message_length', -1),
    # reconnect soon after a refused connection: our own retries pace the attempts
    ('grpc.initial_reconnect_backoff_ms', 100),
    ('grpc.min_reconnect_backoff_ms', 100),
    ('grpc.max_reconnect_backoff_ms', 1000),
]


class GrpcTransport:
    def __init__(self, address: Address, credentials, token: str | None):
        self._address = address
        self._credentials = credentials if address.tls else None
        self._metadata = (('authorization', token),) if token else None
        self._channel = None

    async def __aenter__(self):
        target = self._address.hostport
        if self._credentials is not None:
            self._channel = grpc.secure_channel(target, self._credentials, _OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, _OPTIONS)
        self._call = jina_pb2_grpc.JinaSingleDataRequestRPCStub(self._channel).process_single_data
        return self

    async def __aexit__(self, *exc_info):
        self._channel.close()  # also cancels what is still in flight

    async def send(self, request):
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        call = self._call.future(request, metadata=self._metadata)

        def on_done(finished):  # on a grpc thread
            try:
                loop.call_soon_threadsafe(self._settle, waiter, finished)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        call.add_done_callback(on_done)
        try:
            return await waiter
        except asyncio.CancelledError:
            call.cancel()
            raise

    def _settle(self, waiter: asyncio.Future, call) -> None:
        if waiter.done():
            return
        try:
            waiter.set_result(call.result())
        except grpc.RpcError as err:
            waiter.set_exception(self._translate(err))
        except grpc.FutureCancelledError:
            waiter.cancel()

    def _translate(self, err) -> Exception:
        details = err.details() or ''
        if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # the gateway's bound on requests held at once
            trailers = dict(err.trailing_metadata() or ())
            return RetryableError(f'{self._address} is overloaded: {details}', _seconds(trailers.get('retry-after')))
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            if any(hint in details.lower() for hint in _TLS_FAILURE_HINTS):
                return ConnectionError(
                    f'TLS with {self._address} failed: {details}. If the server uses a private '
                    'certificate authority, pass ca_file='
                )
            return RetryableError(f'{self._address} is unavailable: {details}')
        return BadServerFlow(f'{self._address} answered with gRPC error {err.code().name}: {details}')


def _seconds(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
