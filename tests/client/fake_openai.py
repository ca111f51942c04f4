"""A stand-in for a gateway's /v1/embeddings that answers from a script: 429 with Retry-After, 503, 504, a dropped
connection, a slow answer. A real Flow cannot be made to answer those on cue (its 429 needs a replica at
its admission limit at the right moment), so the retry tests use this; everything else uses real Flows.

An answer that succeeds gives each item the embedding [len(text), 0, 0, 0] (an image: [-1, 0, 0, 0]) as
base64 float32, as the real route does. It records each request's headers, items and arrival time, and
the most requests it held at once. A slow answer waits `delay` seconds or until `release` is set, and
`wait_idle()` returns once no request is being answered, so tests wait on events, not on the clock.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time

import numpy as np

OK = 'ok'
DROP = 'drop'  # close the connection without answering


def _embedding(item: dict) -> str:
    value = float(len(item['text'])) if 'text' in item else -1.0
    return base64.b64encode(np.array([value, 0, 0, 0], '<f4').tobytes()).decode()


class FakeAPI:
    """`script`: what the first requests get, one entry each, then OK: OK, DROP, or (status, headers, body)."""

    def __init__(self, script=(), delay: float = 0.0, port: int = 0):
        self.script = list(script)
        self.delay = delay
        self.requests: list[dict] = []
        self.in_flight = self.most_in_flight = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.release = threading.Event()  # set: slow answers are sent at once
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'

            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
                with fake._lock:
                    fake.requests.append({'headers': dict(self.headers), 'body': body, 'at': time.monotonic()})
                    step = fake.script.pop(0) if fake.script else OK
                    fake.in_flight += 1
                    fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                try:
                    if fake.delay:
                        fake.release.wait(fake.delay)
                    if step == DROP:
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if step == OK:
                        rows = [{'object': 'embedding', 'index': i, 'embedding': _embedding(item)}
                                for i, item in enumerate(body['input'])]  # fmt: skip
                        status, headers, answer = 200, {}, {'object': 'list', 'data': rows, 'model': 'fake'}
                    else:
                        status, headers, answer = step
                    payload = json.dumps(answer).encode()
                    self.send_response(status)
                    for name, value in {'Content-Type': 'application/json', **headers}.items():
                        self.send_header(name, value)
                    self.send_header('Content-Length', str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                        fake._idle.notify_all()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', port), Handler)
        self.server.daemon_threads = True
        self.url = f'http://127.0.0.1:{self.server.server_address[1]}'
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until no request is being answered; False if that has not happened within `timeout`."""
        with self._idle:
            return self._idle.wait_for(lambda: self.in_flight == 0, timeout)

    def __enter__(self) -> FakeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self.server.shutdown()
        self.server.server_close()


def error(status: int, message: str, code: str | None = None, **headers) -> tuple:
    """An answer in OpenAI's error shape."""
    kind = 'server_error' if status >= 500 else 'invalid_request_error'
    return status, headers, {'error': {'message': message, 'type': kind, 'param': None, 'code': code}}
