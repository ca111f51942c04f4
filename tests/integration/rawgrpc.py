"""A bare HTTP/2 client that starts one gRPC call declaring a message of any size and sends it as fast as the
server's flow control lets it, until the server ends the call: how long the server took to refuse it and how
many bytes it took first, without the client building the message (a gRPC library copies all of it before it
sends a byte, which is most of what a test would time)."""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass

PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CHUNK = 16384  # HTTP/2's default largest frame


@dataclass
class Outcome:
    ended_by: str  # 'trailers', 'reset' or 'goaway'
    seconds: float
    sent: int  # message bytes the server took before it ended the call


def _frame(kind: int, flags: int, stream: int, payload: bytes = b'') -> bytes:
    return struct.pack('>I', len(payload))[1:] + bytes([kind, flags]) + struct.pack('>I', stream) + payload


def _literal(name: str, value: str) -> bytes:  # HPACK: literal without indexing, new name, no Huffman
    name_b, value_b = name.encode(), value.encode()
    return b'\x00' + bytes([len(name_b)]) + name_b + bytes([len(value_b)]) + value_b


def declared_call(port: int, method: str, size: int, metadata=(), timeout: float = 30.0) -> Outcome:
    """Start `method` and send one message declaring `size` bytes (zeros), as flow control allows."""
    fields = [
        (':method', 'POST'),
        (':scheme', 'http'),
        (':path', method),
        (':authority', f'127.0.0.1:{port}'),
        ('content-type', 'application/grpc'),
        ('te', 'trailers'),
        *metadata,
    ]
    sock = socket.create_connection(('127.0.0.1', port), timeout=timeout)
    sock.setblocking(False)
    buffer, windows, sent = b'', {'connection': 65535, 'stream': 65535}, 0
    message = b'\x00' + struct.pack('>I', size)  # the 5-byte gRPC prefix: not compressed, its length
    pending = len(message) + size
    started = time.perf_counter()

    def write(data: bytes):
        view = memoryview(data)
        while view:
            select.select([], [sock], [], timeout)
            view = view[sock.send(view) :]

    try:
        write(
            PREFACE + _frame(SETTINGS, 0, 0) + _frame(HEADERS, END_HEADERS, 1, b''.join(_literal(*f) for f in fields))
        )
        while time.perf_counter() - started < timeout:
            readable, _, _ = select.select([sock], [], [], 0 if pending and min(windows.values()) > 0 else 0.05)
            if readable:
                data = sock.recv(1 << 16)
                if not data:
                    return Outcome('closed', time.perf_counter() - started, sent)
                buffer += data
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], 'big')
                    if len(buffer) < 9 + length:
                        break
                    kind, flags, stream = buffer[3], buffer[4], int.from_bytes(buffer[5:9], 'big') & 0x7FFFFFFF
                    payload, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                    if kind == SETTINGS and not flags & ACK:
                        for i in range(0, len(payload), 6):
                            key, value = struct.unpack('>HI', payload[i : i + 6])
                            if key == 0x4:  # SETTINGS_INITIAL_WINDOW_SIZE
                                windows['stream'] += value - 65535
                        write(_frame(SETTINGS, ACK, 0))
                    elif kind == PING and not flags & ACK:
                        write(_frame(PING, ACK, 0, payload))
                    elif kind == WINDOW_UPDATE:
                        windows['connection' if stream == 0 else 'stream'] += (
                            int.from_bytes(payload, 'big') & 0x7FFFFFFF
                        )
                    elif kind == HEADERS and stream == 1 and flags & END_STREAM:
                        return Outcome('trailers', time.perf_counter() - started, sent)
                    elif kind == RST_STREAM and stream == 1:
                        return Outcome('reset', time.perf_counter() - started, sent)
                    elif kind == GOAWAY:
                        return Outcome('goaway', time.perf_counter() - started, sent)
            step = min(CHUNK, pending, *windows.values())
            if step > 0:
                head, message = message[:step], message[step:]
                chunk = head + bytes(step - len(head))
                write(_frame(DATA, END_STREAM if step == pending else 0, 1, chunk))
                pending -= step
                sent += step
                windows['connection'] -= step
                windows['stream'] -= step
        raise TimeoutError(f'the server did not end the call within {timeout} s ({sent} bytes taken)')
    finally:
        sock.close()
