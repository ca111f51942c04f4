"""`data:` URIs, which carry their own bytes and are always decoded, and UriError, the one error of every
URI the server refuses or cannot read (inputs/uris.py, inputs/remote.py, inputs/local_files.py)."""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote_to_bytes


class UriError(ValueError):
    """A URI the policy refuses, or one that cannot be read; the message says which and why."""


def decode_data_uri(uri: str, max_bytes: int) -> bytes:
    """Decode `data:[<mime>][;base64],<payload>`; raises UriError when malformed or too large."""
    header, sep, payload = uri.partition(',')
    if not sep:
        raise UriError('malformed data: URI (no comma before the payload)')
    # base64 grows data by 4/3; refuse before decoding anything huge.
    if len(payload) > max_bytes * 4 // 3 + 4:
        raise UriError(f'the data: URI is larger than the limit of {max_bytes} bytes')
    if header.endswith(';base64'):
        try:
            return base64.b64decode(''.join(payload.split()), validate=True)
        except (binascii.Error, ValueError) as e:
            raise UriError(f'malformed base64 in data: URI: {e}') from e
    return unquote_to_bytes(payload)
