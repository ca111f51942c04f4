"""Progress of a long call: a callback of yours, or a tqdm bar where tqdm is installed.

`progress=True` draws a tqdm bar (`pip install 'clipserve-client[progress]'`); without tqdm it warns
once and the call goes on, since a missing bar is no reason to fail a long job. A callable is called
as `progress(done, total)` after every batch (total is None for an iterable without a length).
"""

from __future__ import annotations

import warnings
from typing import Callable, Union

ProgressArg = Union[bool, Callable[[int, 'int | None'], None], None]


class Progress:
    def __init__(self, progress: ProgressArg, total: int | None, description: str):
        self.done, self.total = 0, total
        self._callback = progress if callable(progress) else None
        self._bar = None
        if progress is True:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                warnings.warn('progress=True needs tqdm (pip install tqdm); going on without a bar', stacklevel=3)
            else:
                self._bar = tqdm(total=total, desc=description, unit='input')
        elif progress not in (None, False) and self._callback is None:
            raise TypeError(f'progress must be True, False, None or a callable(done, total), got {progress!r}')

    def advance(self, count: int) -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
        if self._callback is not None:
            self._callback(self.done, self.total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
