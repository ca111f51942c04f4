"""Shared benchmark helpers: timing loops, machine facts, JSON and plots."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / 'results'


def items_per_second(fn, items: int, min_seconds: float = 2.0, min_runs: int = 2, warmup: int = 1) -> float:
    """Median throughput of `fn` (which processes `items` items) over repeated runs."""
    for _ in range(warmup):
        fn()
    rates, started = [], time.perf_counter()
    while len(rates) < min_runs or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        fn()
        rates.append(items / (time.perf_counter() - t0))
    rates.sort()
    return rates[len(rates) // 2]


def sustained_rate(fn, items: int, seconds: float = 4.0) -> float:
    """Items per second of `fn` called back to back for `seconds` (after one warm-up call): total
    items over total time, the same statistic a served throughput is, so the two compare directly."""
    fn()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        done += items
    return done / (time.perf_counter() - started)


def bracketed(baseline, measures: dict, rounds: int) -> tuple[dict, dict]:
    """Each measure as a ratio to the baseline measured just before and just after it.

    A round runs baseline, m1, baseline, m2, ..., baseline; m_i's ratio in that round is m_i over
    the mean of its two neighbours, so a drift in the machine's speed during the round cancels
    (exactly, when it is linear). Returns (median ratio per measure, median value per measure and
    for 'baseline'). Medians of values merely taken in turn let a drift between windows of the
    same round into the ratios: on this shared machine that moved them by up to 0.2 between runs.
    """
    ratios = {name: [] for name in measures}
    values = {name: [] for name in ['baseline', *measures]}
    for _ in range(rounds):
        before = baseline()
        values['baseline'].append(before)
        for name, measure in measures.items():
            value = measure()
            after = baseline()
            values[name].append(value)
            values['baseline'].append(after)
            ratios[name].append(value / ((before + after) / 2))
            before = after
    return (
        {name: statistics.median(r) for name, r in ratios.items()},
        {name: statistics.median(v) for name, v in values.items()},
    )


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f if line.startswith('model name'))
    except (OSError, StopIteration):
        pass
    return {
        'cpu': cpu,
        'cores': len(os.sched_getaffinity(0)),
        'python': platform.python_version(),
        'load_avg': os.getloadavg()[0],
        'when': time.strftime('%Y-%m-%d %H:%M'),
    }


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f'{name}.json'
    path.write_text(json.dumps(payload, indent=2))
    return path


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def save_plot(path: Path, draw, ncols: int = 1, figsize: tuple = (7, 3.5)) -> None:
    """`draw(axes)` onto a figure saved as PNG next to the JSON at `path` (plots.figure)."""
    from benchmarks.plots import figure

    figure(path, draw, ncols, figsize)
