"""A progress bar on stderr with count, throughput and ETA (rich, which docarray already depends on)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _Throughput(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f'{speed:,.0f} docs/s' if speed else '- docs/s', style='progress.data.speed')


class ProgressBar:
    """`advance(n)` as answers arrive; does nothing when disabled. Unknown totals show no ETA."""

    def __init__(self, description: str, total: int | None, enabled: bool, console: Console | None = None):
        self._progress = None
        if enabled:
            self._progress = Progress(
                TextColumn('[progress.description]{task.description}'),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                _Throughput(),
                TimeElapsedColumn(),
                TextColumn('ETA'),
                TimeRemainingColumn(),
                console=console or Console(stderr=True),
            )
            self._task = self._progress.add_task(description, total=total)

    def __enter__(self):
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc_info):
        if self._progress is not None:
            self._progress.stop()

    def advance(self, count: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, count)
