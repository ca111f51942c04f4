"""A replica's forward passes: one thread runs them all, and chooses fairly what runs next.

One thread rather than a lock around whichever request thread comes: OpenMP gives every thread that
starts a parallel region its own team of workers, and the math libraries keep buffers per thread, so
one thread keeps memory flat (eight threads taking turns at a ViT-B-32: +211 MB; one thread: +14 MB).

Requests hand it their rows as jobs (a minibatch of images or of token ids) and get futures. A batch
is built as follows:
- the requests that have rows waiting are ordered by the rows each has had so far (least first: a
  newcomer is first), then by the rows it has waiting (fewest first), then round robin (every request
  that put rows into a batch goes to the back), as room to decode is given (engine/room.py);
- its kind (images or texts) is that of the first request in that order, so a request that arrives
  behind large ones runs in the batch after the one running now, however many requests wait;
- its rows come from every request waiting with that kind, in that order, a fair share each, round
  after round, up to the kind's batch size: small concurrent requests are merged into one forward
  pass, and a large request is cut into slices that interleave with everyone else's; for a kind whose
  passes are long (images on a CPU: `Task.short_for`), a pass led by a small newcomer takes as many
  rows as a small request has (its own first), so a query image waits for the pass running now and
  a short one of its own;
- with `max_wait` set, a batch that is not full waits up to that long for more rows while other
  requests are still on their way (admitted, not yet handed over), and then, while fewer requests wait
  than were around the last pass of its kind, up to a share of that pass's time for the clients just
  answered to send their next (engine/expected_requests.py; not a small newcomer's short pass);
- a job whose deadline has passed, or whose future was cancelled, is dropped before it runs.
Each caller gets exactly its own rows back, in order. A model failure fails the jobs of that batch only.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from clipserve.engine.expected_requests import SHARE_OF_PASS, ExpectedRequests
from clipserve.engine.small_requests import SmallRequests
from clipserve.errors import DeadlineExceededError


def pad_to(arrays: Sequence[np.ndarray], width: int) -> list[np.ndarray]:
    """Right-pad 2-d token arrays with zeros to `width` columns (for merging trimmed text batches)."""
    return [a if a.shape[1] == width else np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays]


@dataclass(frozen=True)
class Task:
    """One kind of forward pass: `fn` maps row-aligned arrays to [rows, D]; `batch` is the most rows one
    pass takes; `pad_columns` right-pads 2-d arrays of different widths (token ids) before merging;
    `short_for`: a pass led by a small newcomer (engine/small_requests.py: a request that has had no rows, with
    few waiting) takes at most as many rows as a small request has, so it is short (None: every pass may take
    `batch` rows)."""

    fn: Callable[..., np.ndarray]
    batch: int
    pad_columns: bool = False
    short_for: SmallRequests | None = None


_ids = itertools.count()


@dataclass(eq=False)
class _Job:
    kind: str
    arrays: tuple
    request: Hashable
    deadline: float | None
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)
    taken: int = 0  # rows handed to batches so far
    done: int = 0  # rows computed
    out: np.ndarray | None = None
    started: float | None = None

    @property
    def rows(self) -> int:
        return len(self.arrays[0])

    @property
    def left(self) -> int:
        return self.rows - self.taken


@dataclass
class PassCounts:
    """A kind's forward passes so far: how many, their rows, and the seconds the model spent in them (the
    model thread's busy time: with the rows, how well concurrent requests were merged)."""

    passes: int = 0
    rows: int = 0
    seconds: float = 0.0

    def add(self, rows: int, seconds: float) -> None:
        self.passes, self.rows, self.seconds = self.passes + 1, self.rows + rows, self.seconds + seconds

    def as_dict(self) -> dict:
        return {'passes': self.passes, 'rows': self.rows, 'seconds': round(self.seconds, 6)}


@dataclass
class _Slice:
    job: _Job
    start: int
    stop: int


class Scheduler:
    """Runs `tasks[kind].fn` for many requests, one forward pass at a time, on one thread."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        max_wait: float | None = None,
        others_in_flight: Callable[[], bool] = lambda: False,
        on_wait: Callable[[str, float], None] = lambda kind, seconds: None,
        on_pass: Callable[[str, int, float], None] = lambda kind, rows, seconds: None,
        name: str = 'clipserve-model',
    ):
        self.tasks = dict(tasks)
        self.max_wait = max_wait
        self.expected = ExpectedRequests(SHARE_OF_PASS if max_wait else 0.0)
        self.others_in_flight = others_in_flight
        self.on_wait = on_wait  # (kind, seconds from submit to its first rows running): for metrics
        self.on_pass = on_pass  # (kind, rows, seconds in the model) after each pass that ran: for metrics
        self.batches_run = 0
        self.passes = {kind: PassCounts() for kind in self.tasks}
        self.dropped = 0
        self._lock = threading.Condition()
        self._waiting: collections.OrderedDict[Hashable, collections.deque[_Job]] = collections.OrderedDict()
        self._had: dict[Hashable, int] = {}  # rows each waiting request has had (see `served` in submit)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def batching(self) -> bool:
        return self.max_wait is not None

    def submit(
        self,
        kind: str,
        *arrays: np.ndarray,
        request: Hashable = None,
        deadline: float | None = None,
        served: int = 0,
    ) -> Future:
        """Queue `arrays` (row-aligned) for a `kind` pass; the future gives its [rows, D] output. `request`
        groups the jobs of one request for fairness (None: a request of its own); `deadline` is a
        time.monotonic() after which the job is dropped with DeadlineExceededError; `served`: the rows of
        this request submitted before this job, so that a large request's later minibatches do not count
        as a newcomer's when its earlier ones have all run."""
        if kind not in self.tasks:
            raise KeyError(f'no task {kind!r}; known: {sorted(self.tasks)}')
        job = _Job(kind, arrays, request if request is not None else ('job', next(_ids)), deadline)
        if job.rows == 0:
            job.future.set_result(np.zeros((0, 0), np.float32))
            return job.future
        with self._lock:
            if self._closed:
                raise CancelledError('the model thread is closed')
            if job.request not in self._waiting:
                self._had[job.request] = served
            self._waiting.setdefault(job.request, collections.deque()).append(job)
            self._lock.notify()
        return job.future

    def __call__(self, kind: str, *arrays: np.ndarray, request: Hashable = None, deadline: float | None = None):
        """`submit` and wait for the result."""
        return self.submit(kind, *arrays, request=request, deadline=deadline).result()

    def waiting_rows(self) -> dict[str, int]:
        """Rows queued per kind, not yet handed to a batch (a gauge for metrics)."""
        with self._lock:
            counts = collections.Counter()
            for jobs in self._waiting.values():
                for job in jobs:
                    counts[job.kind] += job.left
            return dict(counts)

    def close(self) -> None:
        """Stop: queued jobs are cancelled; a forward pass already running finishes first."""
        with self._lock:
            self._closed = True
            left = [job for jobs in self._waiting.values() for job in jobs]
            self._waiting.clear()
            self._had.clear()
            self._lock.notify()
        for job in left:
            job.future.cancel()
        self._thread.join()

    # ---- the thread ------------------------------------------------------------------------

    def _drop_stale(self) -> None:
        """Remove jobs that can no longer be answered: cancelled, or past their deadline (lock held)."""
        now = time.monotonic()
        for request in list(self._waiting):
            kept = collections.deque()
            for job in self._waiting[request]:
                if job.future.cancelled():
                    self.dropped += 1
                elif job.deadline is not None and now > job.deadline:
                    self.dropped += 1
                    job.future.set_exception(
                        DeadlineExceededError(
                            f'the request waited past its deadline ({now - job.submitted:.2f}s queued)'
                        )
                    )
                else:
                    kept.append(job)
            if kept:
                self._waiting[request] = kept
            else:
                self._forget(request)

    def _forget(self, request: Hashable) -> None:
        """`request` has no rows waiting any more (lock held)."""
        del self._waiting[request]
        self._had.pop(request, None)

    def _order(self) -> list[Hashable]:
        """Waiting requests: least rows had first, then fewest rows waiting, then round robin (lock held)."""

        return sorted(self._waiting, key=lambda request: (self._had.get(request, 0), self._rows_waiting(request)))

    def _rows_waiting(self, request: Hashable) -> int:
        return sum(job.left for job in self._waiting[request])

    def _is_small_newcomer(self, request: Hashable, small: SmallRequests) -> bool:
        return small.is_newcomer(self._had.get(request, 0), self._rows_waiting(request))

    def _fill(self, order, kind: str, limit: int, rows: int, slices: list, contributors: list) -> int:
        """Add rows of `kind` from the requests in `order`, a fair share each, round after round, until the
        batch has `limit` rows (lock held); returns the batch's rows."""
        heads = {}  # per request, its first jobs of this kind: no more than one batch of rows
        for request in order:
            jobs, rows_seen = [], 0
            for job in self._waiting[request]:
                if rows_seen >= limit:
                    break
                if job.kind == kind:
                    jobs.append(job)
                    rows_seen += job.left
            if jobs:
                heads[request] = jobs
        while rows < limit and heads:
            share = max(1, -(-(limit - rows) // len(heads)))
            for request in list(heads):
                jobs = heads[request]
                take = min(share, limit - rows)
                while take and jobs:
                    job = jobs[0]
                    n = min(take, job.left)
                    slices.append(_Slice(job, job.taken, job.taken + n))
                    job.taken += n
                    self._had[request] = self._had.get(request, 0) + n
                    rows += n
                    take -= n
                    if job.left == 0:
                        jobs.pop(0)
                        self._waiting[request].remove(job)
                if request not in contributors:
                    contributors.append(request)
                if not jobs:
                    del heads[request]
                if rows >= limit:
                    break
        return rows

    def _build(self) -> list[_Slice]:
        """The next batch (lock held; `_waiting` not empty)."""
        order = self._order()
        first = self._waiting[order[0]][0]
        kind, limit = first.kind, self.tasks[first.kind].batch
        small = self.tasks[kind].short_for
        groups = [order]
        if small and self._is_small_newcomer(order[0], small):
            limit = min(limit, small.documents)  # a short pass: every small newcomer's rows first, then others'
            newcomers = {request for request in order if self._is_small_newcomer(request, small)}
            groups = [[r for r in order if r in newcomers], [r for r in order if r not in newcomers]]
        slices, rows, contributors = [], 0, []
        for group in groups:
            rows = self._fill(group, kind, limit, rows, slices, contributors)
        for request in contributors:  # to the back of the round robin
            if request in self._waiting:
                if self._waiting[request]:
                    self._waiting.move_to_end(request)
                else:
                    self._forget(request)
        return slices

    def _next_batch(self) -> list[_Slice] | None:
        with self._lock:
            while True:
                if self._closed:
                    return None
                self._drop_stale()
                if self._waiting:
                    break
                self._lock.wait()
            if self.batching:
                self._wait_for_company()
                if self._closed or not self._waiting:
                    return [] if not self._closed else None
            return self._build()

    def _wait_for_company(self) -> None:
        """Let a pass that is not full wait for rows on their way (lock held): once for requests admitted and not
        yet queued (`others_in_flight`), then for requests expected back (expected_requests.py), unless it is a
        small newcomer's short pass (whose wait is the person's)."""
        if self._queued_short() is not None and self.others_in_flight():
            self._lock.wait(self.max_wait)
            self._drop_stale()
        started = time.monotonic()
        while (short := self._queued_short()) is not None and not short[2]:
            left = started + self.expected.allowed(*short[:2], started) - time.monotonic()
            if left <= 0:
                return
            self._lock.wait(left)
            self._drop_stale()

    def _queued_short(self) -> tuple[str, int, bool] | None:
        """(kind, requests waiting for it, whether a small newcomer leads a short pass) when the next pass's kind
        has fewer rows queued than its batch (lock held); None when it is full, or nothing waits, or closed."""
        if self._closed or not self._waiting:
            return None
        order = self._order()
        kind = self._waiting[order[0]][0].kind
        small = self.tasks[kind].short_for
        requests = [jobs for jobs in self._waiting.values() if any(job.kind == kind for job in jobs)]
        queued = sum(job.left for jobs in requests for job in jobs if job.kind == kind)
        leads_short = small is not None and self._is_small_newcomer(order[0], small)
        return (kind, len(requests), leads_short) if queued < self.tasks[kind].batch else None

    def _run(self, slices: list[_Slice]) -> None:
        kind = slices[0].job.kind
        task = self.tasks[kind]
        now = time.monotonic()
        for piece in slices:
            if piece.job.started is None:
                piece.job.started = now
                self.on_wait(kind, now - piece.job.submitted)
        try:
            columns = list(zip(*(tuple(a[p.start : p.stop] for a in p.job.arrays) for p in slices)))
            if task.pad_columns and len(slices) > 1:
                width = max(a.shape[1] for a in columns[0])
                columns = [pad_to(column, width) if column[0].ndim == 2 else column for column in columns]
            merged = [np.concatenate(column) if len(column) > 1 else column[0] for column in columns]
            started = time.perf_counter()
            out = task.fn(*merged)
            seconds = time.perf_counter() - started
            self.batches_run += 1
            self.passes[kind].add(len(merged[0]), seconds)
            if self.batching:
                with self._lock:
                    around = {r for r, jobs in self._waiting.items() if any(job.kind == kind for job in jobs)}
                around |= {piece.job.request for piece in slices}
                self.expected.after_pass(kind, len(around), seconds, time.monotonic())
            self.on_pass(kind, len(merged[0]), seconds)
        except BaseException as error:  # a model failure fails exactly the jobs in this batch
            for job in {id(p.job): p.job for p in slices}.values():
                self._fail(job, error)
            return
        row = 0
        for piece in slices:
            job, n = piece.job, piece.stop - piece.start
            if job.future.done():  # failed or cancelled meanwhile
                row += n
                continue
            if job.out is None:
                job.out = np.empty((job.rows, *out.shape[1:]), dtype=out.dtype)
            job.out[piece.start : piece.stop] = out[row : row + n]
            row += n
            job.done += n
            if job.done == job.rows:
                job.future.set_result(job.out)

    def _fail(self, job: _Job, error: BaseException) -> None:
        with self._lock:  # its rows not yet taken must not run
            jobs = self._waiting.get(job.request)
            if jobs and job in jobs:
                jobs.remove(job)
                if not jobs:
                    self._forget(job.request)
        if not job.future.done():
            job.future.set_exception(error)

    def _loop(self) -> None:
        while True:
            slices = self._next_batch()
            if slices is None:
                return
            if slices:
                self._run(slices)
