"""Which certificates to trust, per client: a CA file (like curl --cacert) or the system's store.

Trust is an object owned by one client, never a process-wide environment variable (SSL_CERT_FILE),
so two clients in one process can trust different authorities.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def read_ca(ca_file: str | Path) -> bytes:
    path = Path(ca_file)
    if not path.is_file():
        raise FileNotFoundError(f'ca_file {str(path)!r} does not exist or is not a file')
    return path.read_bytes()


def ssl_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """Only `ca_file` if given, else the system store."""
    if ca_file is None:
        return ssl.create_default_context()
    read_ca(ca_file)  # a clear error for a missing file
    return ssl.create_default_context(cafile=str(ca_file))
