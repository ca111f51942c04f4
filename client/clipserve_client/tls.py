"""Which certificates to trust, per client.

jina's own Client offers no CA option: its gRPC channel is built without `root_certificates` and
its aiohttp sessions use aiohttp's default SSL context, made once when aiohttp is imported. The only
knobs there are process-wide environment variables (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, SSL_CERT_FILE)
that must be set before the first use. Here trust is an object owned by one Client instead.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def _read_ca(ca_file: str | Path) -> bytes:
    path = Path(ca_file)
    if not path.is_file():
        raise FileNotFoundError(f'ca_file {str(path)!r} does not exist or is not a file')
    return path.read_bytes()


def ssl_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """For https:// and wss://: only `ca_file` if given (like curl --cacert), else the system store."""
    if ca_file is None:
        return ssl.create_default_context()
    _read_ca(ca_file)  # a clear error for a missing file
    return ssl.create_default_context(cafile=str(ca_file))


def grpc_credentials(ca_file: str | Path | None):
    """For grpcs://: only `ca_file` if given, else gRPC's default roots."""
    import grpc

    roots = _read_ca(ca_file) if ca_file is not None else None
    return grpc.ssl_channel_credentials(root_certificates=roots)
