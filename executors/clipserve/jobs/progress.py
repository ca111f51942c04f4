"""The progress line (rows done, rate, ETA, errors) and the summary a bulk run prints, on standard error.

A run of millions of rows needs to say how far it is and how long is left without a dependency: one line
redrawn in place on a terminal, a plain line every 30 s when the output goes to a log file. The rate is
measured over this run's own rows (shards a previous run finished are counted as skipped, not as speed).
"""

from __future__ import annotations

import sys
import time


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds >= 3600:
        return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'
    if seconds >= 60:
        return f'{seconds // 60}m{seconds % 60:02d}s'
    return f'{seconds}s'


class Progress:
    def __init__(self, total_rows: int, skipped_rows: int, shards: int, quiet: bool = False, stream=None):
        self.total = total_rows  # rows this run has to do
        self.skipped = skipped_rows
        self.shards = shards
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, 'isatty', lambda: False)())
        self.started = time.monotonic()
        self.rows = self.errors = self.images = self.texts = self.shards_done = 0
        self._drawn = 0.0

    def update(self, rows: int, errors: int, images: int, texts: int, shards: int = 0) -> None:
        self.rows += rows
        self.errors += errors
        self.images += images
        self.texts += texts
        self.shards_done += shards
        now = time.monotonic()
        finished = self.rows >= self.total and self.shards_done >= self.shards
        if not self.quiet and (now - self._drawn >= (0.5 if self.tty else 30.0) or finished):
            self._drawn = now
            self._draw(now)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def _draw(self, now: float) -> None:
        rate = self.rate()
        left = (self.total - self.rows) / rate if rate > 0 else float('nan')
        percent = 100.0 * self.rows / self.total if self.total else 100.0
        width = 24
        filled = int(width * percent / 100)
        line = (
            f'[{"#" * filled}{"." * (width - filled)}] {self.rows}/{self.total} rows ({percent:.1f}%) '
            f'{rate:.1f} rows/s ETA {_duration(left) if left == left else "?"} '
            f'shards {self.shards_done}/{self.shards} errors {self.errors}'
        )
        self.stream.write(('\r' + line + '\x1b[K') if self.tty else line + '\n')
        self.stream.flush()

    def summary(self, interrupted: bool = False) -> dict:
        elapsed = time.monotonic() - self.started
        return {
            'rows': self.rows,
            'embedded': self.rows - self.errors,
            'errors': self.errors,
            'images': self.images,
            'texts': self.texts,
            'skipped_rows': self.skipped,
            'shards_written': self.shards_done,
            'seconds': round(elapsed, 3),
            'images_per_second': round(self.images / elapsed, 2) if elapsed > 0 else 0.0,
            'rows_per_second': round(self.rows / elapsed, 2) if elapsed > 0 else 0.0,
            'interrupted': interrupted,
        }

    def close(self) -> None:
        if self.tty and not self.quiet and self._drawn:
            self.stream.write('\n')
            self.stream.flush()
