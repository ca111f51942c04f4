"""Read the bytes of an image the client was given by reference: an http(s) URL, a data: URI, a file.

Shared by both clients. urllib is enough for one GET with a deadline and a size cap (no pool to keep).
"""

from __future__ import annotations

import base64
import binascii
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote_to_bytes

from clipserve_client.errors import FetchError

_CHUNK = 1 << 16


def fetch_url(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET `url`; `timeout` bounds the whole download, not each read, and `max_bytes` its size."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={'User-Agent': 'clipserve-client'})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            length = reply.headers.get('Content-Length')
            if length and length.isdigit() and int(length) > max_bytes:
                raise FetchError(f'{url}: {int(length)} bytes is over the limit of {max_bytes} bytes')
            chunks, size = [], 0
            while chunk := reply.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f'{url}: larger than the limit of {max_bytes} bytes')
                if time.monotonic() > deadline:
                    raise FetchError(f'{url}: not downloaded within {timeout} s')
                chunks.append(chunk)
    except urllib.error.HTTPError as err:
        raise FetchError(f'{url}: HTTP {err.code} {err.reason}') from None
    except urllib.error.URLError as err:
        raise FetchError(f'{url}: {err.reason}') from None
    except TimeoutError:
        raise FetchError(f'{url}: no answer within {timeout} s') from None
    except OSError as err:
        if isinstance(err, FetchError):
            raise
        raise FetchError(f'{url}: {err}') from None
    return b''.join(chunks)


def read_data_uri(uri: str, *, max_bytes: int) -> bytes:
    """The payload of `data:[<mime>][;base64],<data>`."""
    header, comma, payload = uri.partition(',')
    if not comma:
        raise FetchError(f'{uri[:40]}...: a data: URI needs a comma before its payload')
    try:
        data = base64.b64decode(payload, validate=True) if header.endswith(';base64') else unquote_to_bytes(payload)
    except (binascii.Error, ValueError) as err:
        raise FetchError(f'{uri[:40]}...: bad base64 payload ({err})') from None
    if len(data) > max_bytes:
        raise FetchError(f'{uri[:40]}...: larger than the limit of {max_bytes} bytes')
    return data


def read_file(path: str | Path, text_hint: str | None = 'Document(text={})') -> bytes:
    """The file's bytes. `text_hint`: how the caller would send this string as a text instead ({} is the string)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        hint = f'. To encode this string as text, pass {text_hint.format(repr(str(path)))}' if text_hint else ''
        raise FetchError(f'{str(path)!r}: no such file{hint}') from None
    except OSError as err:
        raise FetchError(f'{str(path)!r}: {err.strerror or err}') from None
