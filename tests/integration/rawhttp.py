"""A bare HTTP/1.1 client for the limit tests: it sends a body piece by piece and stops as soon as the server
answers, so a test can tell "refused before reading" from "read, then refused" (bytes sent) and never blocks
on a server that answered early and closed."""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    sent: int  # body bytes the server took before it answered


def exchange(port: int, method: str, path: str, pieces, headers=(), length: int | None = None, timeout=60.0):
    """Send `pieces` (an iterable of bytes) as the body: with Content-Length `length` when given, else chunked."""
    head = [f'{method} {path} HTTP/1.1', f'Host: 127.0.0.1:{port}', 'Connection: close']
    head += [f'{k}: {v}' for k, v in headers]
    head.append(f'Content-Length: {length}' if length is not None else 'Transfer-Encoding: chunked')
    sock = socket.create_connection(('127.0.0.1', port), timeout=timeout)
    sent = 0
    try:
        sock.sendall(('\r\n'.join(head) + '\r\n\r\n').encode())
        for piece in pieces:
            if _answered(sock):
                break
            data = piece if length is not None else b'%x\r\n%s\r\n' % (len(piece), piece)
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        else:
            if length is None:
                try:
                    sock.sendall(b'0\r\n\r\n')
                except (BrokenPipeError, ConnectionResetError):
                    pass
        return _read_answer(sock, sent)
    finally:
        sock.close()


def _answered(sock) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _read_answer(sock, sent: int) -> Answer:
    data = b''
    while b'\r\n\r\n' not in data:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b''
        if not chunk:
            raise ConnectionError(f'the server closed without an answer after {sent} body bytes: {data[:200]!r}')
        data += chunk
    head, _, rest = data.partition(b'\r\n\r\n')
    lines = head.decode('latin-1').split('\r\n')
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(':') for line in lines[1:])}
    want = int(headers.get('content-length', -1))
    while want < 0 or len(rest) < want:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        rest += chunk
    return Answer(status, headers, rest, sent)


def pieces_of(data: bytes, size: int = 1 << 20):
    for start in range(0, len(data), size):
        yield data[start : start + size]


def repeated(prefix: bytes, item: bytes, count: int, suffix: bytes, size: int = 1 << 20):
    """`prefix + item * count + suffix` in pieces of about `size` bytes, never all in memory at once."""
    yield prefix
    per_piece = max(1, size // len(item))
    left = count
    while left > 0:
        n = min(per_piece, left)
        yield item * n
        left -= n
    yield suffix
