"""Loopback HTTP servers on raw sockets for the remote-fetch tests: a test controls every byte and pause."""

import socket
import ssl
import threading
import time


class Forbidden(BaseException):
    """A connection attempt outside loopback; BaseException so no except clause in the code under test hides it."""


class Server:
    """A loopback HTTP server on raw sockets, so a test controls every byte and every pause of the answer.

    `respond(conn, path, headers)` writes the answer; requests are recorded as (path, headers) pairs.
    A `raw` server calls `respond(conn)` on accepting, before reading anything.
    """

    def __init__(self, respond, host='127.0.0.1', port=0, tls=None, raw=False):
        self.respond, self.tls, self.raw, self.requests = respond, tls, raw, []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.host, self.port = self.sock.getsockname()
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            conn.settimeout(15)
            if self.raw:
                return self.respond(conn)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b''
            while b'\r\n\r\n' not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            request_line, *lines = data.split(b'\r\n\r\n')[0].decode('latin-1').split('\r\n')
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(':') for line in lines)}
            self.requests.append((request_line.split(' ')[1], headers))
            self.respond(conn, request_line.split(' ')[1], headers)
        except (OSError, ssl.SSLError):
            pass  # the client went away (as it should, when it gives up on a slow answer)
        finally:
            conn.close()

    def close(self):
        self.stopped = True
        self.sock.close()


def answer(conn, status=200, body=b'', headers=()):
    head = f'HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n'
    head += ''.join(f'{k}: {v}\r\n' for k, v in headers)
    conn.sendall(head.encode() + b'\r\n' + body)


def drip(conn, data, every=0.1):
    for i in range(len(data)):
        conn.sendall(data[i : i + 1])
        time.sleep(every)


def standard(conn, path, headers):
    """/image -> b'image'; /redirect?<location> -> 302 there; /status/<n> -> Location /image with status n."""
    if path == '/image':
        answer(conn, body=b'image')
    elif path.startswith('/redirect?'):
        answer(conn, 302, headers=[('Location', path.split('?', 1)[1])])
    elif path.startswith('/status/'):
        answer(conn, int(path.rsplit('/', 1)[1]), headers=[('Location', '/image')])
    elif path == '/loop':
        answer(conn, 302, headers=[('Location', '/loop')])
    else:
        answer(conn, 404)
