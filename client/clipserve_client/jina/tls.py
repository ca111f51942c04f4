"""Which certificates to trust, per client, for the Jina protocols.

jina's own Client offers no CA option: its gRPC channel is built without `root_certificates` and
its aiohttp sessions use aiohttp's default SSL context, made once when aiohttp is imported. The only
knobs there are process-wide environment variables (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, SSL_CERT_FILE)
that must be set before the first use. Here trust is an object owned by one Client instead.
"""

from __future__ import annotations

from pathlib import Path

from clipserve_client.tls import read_ca, ssl_context

__all__ = ['grpc_credentials', 'ssl_context']


def grpc_credentials(ca_file: str | Path | None):
    """For grpcs://: only `ca_file` if given, else gRPC's default roots."""
    import grpc

    roots = read_ca(ca_file) if ca_file is not None else None
    return grpc.ssl_channel_credentials(root_certificates=roots)
