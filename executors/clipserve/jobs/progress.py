"""The one progress display of the server's long commands (`embed`, `index`), and the summary `embed` prints.

A run of millions of rows needs to say how far it is and how long is left without a dependency: one line
(a bar, done/total, rate, ETA, and what the command adds) redrawn in place on a terminal, a plain line every
30 s when the output goes to a log file. The rate is measured over this run's own work (shards a previous
run finished are counted as skipped, not as speed).
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


class ProgressLine:
    """`advance(n)` as work is done; `extra()` adds the command's own fields to the line."""

    def __init__(self, total: int, unit: str, quiet: bool = False, stream=None, extra=lambda: ''):
        self.total, self.unit, self.quiet, self.extra = total, unit, quiet, extra
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, 'isatty', lambda: False)())
        self.started = time.monotonic()
        self.done = 0
        self._drawn = 0.0

    def advance(self, count: int, finished: bool | None = None) -> None:
        self.done += count
        now = time.monotonic()
        finished = self.done >= self.total if finished is None else finished
        if not self.quiet and (now - self._drawn >= (0.5 if self.tty else 30.0) or finished):
            self._drawn = now
            self._draw()

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def _draw(self) -> None:
        rate = self.rate()
        left = (self.total - self.done) / rate if rate > 0 else float('nan')
        percent = 100.0 * self.done / self.total if self.total else 100.0
        width = 24
        filled = int(width * percent / 100)
        line = (
            f'[{"#" * filled}{"." * (width - filled)}] {self.done}/{self.total} {self.unit} ({percent:.1f}%) '
            f'{rate:.1f} {self.unit}/s ETA {_duration(left) if left == left else "?"}'
        )
        extra = self.extra()
        line += f' {extra}' if extra else ''
        self.stream.write(('\r' + line + '\x1b[K') if self.tty else line + '\n')
        self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet and self._drawn:
            self.stream.write('\n')
            self.stream.flush()


class Progress:
    """`embed`'s progress: rows on the line, with its shards and errors, and the run's summary."""

    def __init__(self, total_rows: int, skipped_rows: int, shards: int, quiet: bool = False, stream=None):
        self.total = total_rows  # rows this run has to do
        self.skipped = skipped_rows
        self.shards = shards
        self.rows = self.errors = self.images = self.texts = self.shards_done = 0
        self.line = ProgressLine(total_rows, 'rows', quiet, stream, self._extra)
        self.started = self.line.started

    def update(self, rows: int, errors: int, images: int, texts: int, shards: int = 0) -> None:
        self.rows += rows
        self.errors += errors
        self.images += images
        self.texts += texts
        self.shards_done += shards
        self.line.advance(rows, finished=self.rows >= self.total and self.shards_done >= self.shards)

    def rate(self) -> float:
        return self.line.rate()

    def _extra(self) -> str:
        return f'shards {self.shards_done}/{self.shards} errors {self.errors}'

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
        self.line.close()
