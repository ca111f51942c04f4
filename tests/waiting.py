"""Waiting on a state, not on the clock: a test that needs "the first batch is running" or "both requests are
queued" waits until it is observably so, with a bound far past what a loaded machine needs."""

from __future__ import annotations

import time


def wait_until(condition, what: str, seconds: float = 60.0, every: float = 0.005) -> None:
    """Return as soon as `condition()` is true; AssertionError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f'timed out after {seconds:g} s waiting until {what}')
        time.sleep(every)
