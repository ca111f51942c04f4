"""One connection to a Jina gateway per call, speaking its wire protocol directly.

Each transport is an async context manager with `send(request) -> response` for one DataRequest.
Transient failures raise RetryableError (the caller backs off and sends again); everything else
raises a final error. Transports are not shared between event loops or threads.
"""

from __future__ import annotations

from clipserve_client.jina.address import Address


def open_transport(address: Address, *, credentials, ssl_context, token: str | None):
    """The transport for `address.protocol`, not yet entered."""
    if address.protocol == 'grpc':
        from clipserve_client.jina.transports.grpc import GrpcTransport

        return GrpcTransport(address, credentials, token)
    if address.protocol == 'http':
        from clipserve_client.jina.transports.http import HttpTransport

        return HttpTransport(address, ssl_context, token)
    from clipserve_client.jina.transports.websocket import WebSocketTransport

    return WebSocketTransport(address, ssl_context, token)
