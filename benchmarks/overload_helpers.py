"""The overload benchmark's measuring helpers, with no Flow in them: the open loop's schedule, what a
request's outcome was, percentiles, resident memory sampled over time, and one run's summary.

benchmarks/overload.py drives a Flow with these; tests/unit/test_overload_helpers.py checks them alone.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

import numpy as np

KINDS = ('large', 'text', 'image')  # 8 JPEGs of 640x480; one short text; one JPEG
IMAGES = {'large': 8, 'text': 0, 'image': 1}  # images per request of each kind


# ---- the open loop's schedule -----------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the start of the window
    kind: str


def _poisson_times(rng: np.random.Generator, rate: float, seconds: float) -> list[float]:
    """Arrival times of a Poisson process at `rate`/s within `seconds` (exponential gaps drawn from `rng`)."""
    times, t = [], 0.0
    while True:
        t += rng.exponential(1 / rate)
        if t >= seconds:
            return times
        times.append(t)


def arrivals(
    large_rate: float, seconds: float, small_fraction: float = 0.2, poisson: bool = True, seed: int = 0
) -> list[Arrival]:
    """The requests of an open loop: `large_rate` large requests/s, plus small ones (half texts, half images)
    making `small_fraction` of all requests, for `seconds`.

    Poisson: exponential gaps and each request's kind drawn at random (seeded). Fixed: even gaps, and every
    small request placed where the running share of small ones crosses `small_fraction`, texts and images
    taking turns, so any prefix of the schedule has the mix.
    """
    if large_rate <= 0 or seconds <= 0:
        return []
    if not 0 <= small_fraction < 1:
        raise ValueError(f'small_fraction must be in [0, 1), got {small_fraction}')
    total = large_rate / (1 - small_fraction)
    rng = np.random.default_rng(seed)
    if poisson:
        times = _poisson_times(rng, total, seconds)
        p = [1 - small_fraction, small_fraction / 2, small_fraction / 2]
        kinds = [str(k) for k in rng.choice(KINDS, size=len(times), p=p)] if times else []
        return [Arrival(float(a), k) for a, k in zip(times, kinds)]
    out, small = [], 0
    for i in range(int(math.ceil(seconds * total - 1e-9))):
        if math.floor((i + 1) * small_fraction + 1e-9) > math.floor(i * small_fraction + 1e-9):
            kind = ('text', 'image')[small % 2]
            small += 1
        else:
            kind = 'large'
        out.append(Arrival(i / total, kind))
    return out


def small_arrivals(rate: float, seconds: float, seed: int = 0) -> list[Arrival]:
    """Small requests only (half texts, half images, drawn at random, seeded) at `rate`/s, Poisson, for
    `seconds`: what an open loop at some load sends besides its large requests."""
    if rate <= 0 or seconds <= 0:
        return []
    rng = np.random.default_rng(seed)
    times = _poisson_times(rng, rate, seconds)
    return [Arrival(float(at), str(kind)) for at, kind in zip(times, rng.choice(KINDS[1:], size=len(times)))]


async def open_loop(
    schedule: list[Arrival], drain: float, send: Callable[[Outcome, int, float], Awaitable[None]]
) -> list[Outcome]:
    """Start `send(outcome, index, start)` for each arrival at its time, never waiting for earlier ones to be
    answered; after the last, wait up to `drain` seconds for all. `send` fills in its outcome (times in
    seconds since `start`, a time.monotonic()); one still running after the drain is cancelled and stays lost."""
    start, tasks, outcomes = time.monotonic(), [], []
    for i, arrival in enumerate(schedule):
        delay = start + arrival.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        outcome = Outcome(arrival.kind, arrival.at, time.monotonic() - start)
        outcomes.append(outcome)
        tasks.append(asyncio.create_task(send(outcome, i, start)))
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for outcome in outcomes:
        if outcome.status == LOST:
            outcome.ended = None
    return outcomes


# ---- one request's outcome --------------------------------------------------------------------------

OK, REFUSED, UNCLEAR, ERROR, LOST = 'ok', 'refused', 'refused_unclear', 'error', 'lost'


@dataclass
class Outcome:
    kind: str
    scheduled: float  # seconds from the window's start: when it was due to be sent
    sent: float  # when it was sent (the client's lag is sent - scheduled)
    ended: float | None = None  # when its answer (or error) came; None: never
    status: str = LOST
    detail: str = ''
    limit: str | None = None  # a refusal: the limit it names
    retry_after: float | None = None  # a refusal: the seconds it says to wait

    @property
    def latency(self) -> float | None:
        return None if self.ended is None else self.ended - self.sent

    def as_dict(self) -> dict:
        return asdict(self)


def _rpc_error(error: BaseException):
    """The grpc error behind `error` (Jina's client raises it as is or as the cause of its own), or None."""
    seen = error
    while seen is not None:
        if callable(getattr(seen, 'code', None)) and callable(getattr(seen, 'details', None)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def classify(error: BaseException) -> tuple[str, str, str | None, float | None]:
    """(status, detail, limit, retry_after) of a failed request, from what the client raised.

    A refusal is clear when the client can tell which limit was hit and when to retry: the executor's
    OverloadedError relayed by the gateway (Jina's BadServer: the error header names the class, its second
    argument is JSON {'limit', 'retry_after'}), or a gateway's own RESOURCE_EXHAUSTED with a `retry-after`
    in its metadata. Everything else is an error of another kind.
    """
    from clipserve.errors import details_of

    header = error.args[0] if error.args else None
    exception = getattr(getattr(header, 'status', None), 'exception', None)
    if exception is not None and getattr(exception, 'name', ''):
        name, args = exception.name, list(exception.args)
        text = f'{name}: {args[0] if args else ""}'[:300]
        if name != 'OverloadedError':
            return ERROR, text, None, None
        details = details_of(args)
        limit, retry_after = details.get('limit'), details.get('retry_after')
        clear = isinstance(limit, str) and isinstance(retry_after, (int, float)) and retry_after > 0
        return (REFUSED if clear else UNCLEAR), text, limit, (float(retry_after) if clear else None)
    rpc = _rpc_error(error)
    if rpc is not None:
        code = getattr(rpc.code(), 'name', str(rpc.code()))
        text = f'gRPC {code}: {rpc.details()}'[:300]
        if code != 'RESOURCE_EXHAUSTED':
            return ERROR, text, None, None
        metadata = {}
        for source in ('trailing_metadata', 'initial_metadata'):
            try:
                metadata.update({k.lower(): v for k, v in (getattr(rpc, source)() or ())})
            except Exception:  # noqa: BLE001 - a call without metadata
                pass
        try:
            retry_after = float(metadata.get('retry-after'))
        except (TypeError, ValueError):
            retry_after = None
        limit = metadata.get('limit') or metadata.get('x-clipserve-limit') or 'gateway'
        return (REFUSED if retry_after and retry_after > 0 else UNCLEAR), text, limit, retry_after
    return ERROR, f'{type(error).__name__}: {error}'[:300], None, None


# ---- statistics ---------------------------------------------------------------------------------------


def percentile(values, q: float) -> float:
    """The q-th percentile (linear between ranks, as numpy's default); nan for no values."""
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else float('nan')


def summarize(outcomes: list[Outcome], seconds: float) -> dict:
    """One run's counts, goodput and latency per kind.

    Goodput is what was answered correctly over the time it took: from the window's start (requests are sent
    for `seconds`) to the last correct answer. While overloaded the Flow holds a queue it works off after the
    window, so this is its useful throughput under that load; the same counted only up to the window's end
    (`*_in_window`) also charges the first answers' latency to it.
    """
    counts = {s: sum(o.status == s for o in outcomes) for s in (OK, REFUSED, UNCLEAR, ERROR, LOST)}
    ok = [o for o in outcomes if o.status == OK and o.ended is not None]
    in_window = [o for o in ok if o.ended <= seconds]
    span = max([seconds, *(o.ended for o in ok)])
    out = {
        'sent': len(outcomes),
        'sent_per_s': {kind: sum(o.kind == kind for o in outcomes) / seconds for kind in KINDS},
        **counts,
        'span_s': span,
        'goodput_requests_per_s': len(ok) / span,
        'goodput_images_per_s': sum(IMAGES[o.kind] for o in ok) / span,
        'goodput_requests_per_s_in_window': len(in_window) / seconds,
        'goodput_images_per_s_in_window': sum(IMAGES[o.kind] for o in in_window) / seconds,
        'max_send_lag_s': max((o.sent - o.scheduled for o in outcomes), default=0.0),
        'first_refusal_s': min((o.sent for o in outcomes if o.status in (REFUSED, UNCLEAR)), default=None),
        'refused_latency_p99_s': percentile([o.latency for o in outcomes if o.status in (REFUSED, UNCLEAR)], 99),
        'refusal_limits': sorted({str(o.limit) for o in outcomes if o.status in (REFUSED, UNCLEAR)}),
        'error_samples': [o.detail for o in outcomes if o.status in (ERROR, UNCLEAR)][:5],
        'kinds': {},
    }
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        done = [o.latency for o in mine if o.status == OK]
        out['kinds'][kind] = {
            'sent': len(mine),
            'ok': len(done),
            'refused': sum(o.status in (REFUSED, UNCLEAR) for o in mine),
            'p50_s': percentile(done, 50),
            'p99_s': percentile(done, 99),
        }
    return out


# ---- resident memory over time -------------------------------------------------------------------------


def vm_rss_mb(pid: int) -> float | None:
    """A process's resident memory (VmRSS) in MiB; None once it has gone."""
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used so far, from /proc/<pid>/stat; None once it has gone."""
    try:
        fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


@dataclass
class RssSampler:
    """Samples VmRSS of named processes every `interval` seconds on a thread of its own, with the load average:
    `samples` is a list of (seconds since start, {name: MiB}, 1-minute load average)."""

    pids: dict[str, int]
    interval: float = 0.5
    samples: list = field(default_factory=list)

    def __post_init__(self):
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name='rss-sampler', daemon=True)

    def sample(self) -> tuple:
        rss = {name: vm_rss_mb(pid) for name, pid in self.pids.items()}
        row = (time.monotonic() - self.started, {k: v for k, v in rss.items() if v is not None}, os.getloadavg()[0])
        self.samples.append(row)
        return row

    def now(self) -> float:
        return time.monotonic() - self.started

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, start: float, stop: float) -> list[tuple]:
        return [s for s in list(self.samples) if start <= s[0] <= stop]

    def total(self, start: float, stop: float, names=None) -> list[float]:
        """The summed RSS of `names` (all by default) at each sample between `start` and `stop`."""
        return [
            sum(v for k, v in rss.items() if names is None or k in names) for _, rss, _ in self.between(start, stop)
        ]


def memory_growth(sampler: RssSampler, baseline: tuple[float, float], window: tuple[float, float]) -> dict:
    """RSS per process and summed: the mean over the `baseline` interval (after warm-up), then the peak and the
    mean of the last quarter of the `window`, each as growth over the baseline."""
    out = {}
    for name in [*sampler.pids, 'total']:
        names = None if name == 'total' else {name}
        base, during = sampler.total(*baseline, names), sampler.total(*window, names)
        if not base or not during:
            continue
        before = float(np.mean(base))
        end = float(np.mean(during[-max(1, len(during) // 4) :]))
        out[name] = {
            'baseline_mb': before,
            'peak_mb': max(during),
            'end_mb': end,
            'peak_growth': max(during) / before - 1,
            'end_growth': end / before - 1,
        }
    return out
