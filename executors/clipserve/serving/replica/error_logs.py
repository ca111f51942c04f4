"""Client errors in the replica's log: one line each, at most one per kind every few seconds.

Jina logs every exception an endpoint raises at ERROR, with its traceback. A refusal the client was
told about (overloaded, past its deadline, a bad parameter or document, too large) is not a fault of
the server: under overload a replica refuses hundreds of requests a second, and a traceback each would
bury the errors that matter and fill the disk. These become one WARNING line per error kind every
`every` seconds, saying how many more of that kind came since; server faults keep Jina's ERROR and traceback.
"""

from __future__ import annotations

import logging
import threading
import time

from clipserve.errors import ClipServeError

WARNING_EVERY_SECONDS = 5.0


def is_client_error(error: BaseException | None) -> bool:
    """Whether `error` is one clipserve raises on purpose about the request (4xx, or a retryable refusal)."""
    return isinstance(error, ClipServeError) and (error.http_status < 500 or error.retryable)


class ClientErrorFilter(logging.Filter):
    """A logging filter: client errors' records lose their traceback, become WARNING, and are thinned."""

    def __init__(self, every: float = WARNING_EVERY_SECONDS, clock=time.monotonic):
        super().__init__()
        self.every = every
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # error code -> when a line was last let through
        self._folded: dict[str, int] = {}  # error code -> records dropped since

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not is_client_error(error):
            return True
        now = self.clock()
        with self._lock:
            last = self._last.get(error.code)
            if last is not None and now - last < self.every:
                self._folded[error.code] = self._folded.get(error.code, 0) + 1
                return False
            folded = self._folded.pop(error.code, 0)
            self._last[error.code] = now
        more = f' (and {folded} more {error.code} in the last {now - last:.0f}s)' if folded else ''
        record.msg, record.args = f'{type(error).__name__} ({error.code}): {error.message}{more}', None
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def quiet_client_errors(logger: logging.Logger, every: float = WARNING_EVERY_SECONDS) -> ClientErrorFilter:
    """Install a ClientErrorFilter on `logger` (once); returns the one installed."""
    for existing in logger.filters:
        if isinstance(existing, ClientErrorFilter):
            return existing
    installed = ClientErrorFilter(every)
    logger.addFilter(installed)
    return installed
