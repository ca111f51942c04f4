"""A request's texts and images to embeddings, through the replica's shared pools and its model thread.

Images come in as sources: a decoder (pixels from bytes, or from content the request carried) and,
for an image named by URI, a fetch. Fetches run in the fetch pool within the request's budget
(engine/fetch.py); decoding runs in the preprocessing pool (engine/priority_pool.py: a newcomer's
images first, in the order room is given), an image only once its bytes are there, so no decoding
thread ever waits on the network; minibatches go to the model thread (engine/
scheduler.py) as soon as they are decoded, while the next minibatch is fetched and decoded. Pillow
and numpy release the GIL, so this overlaps for real. Failures are collected per item, never raised
mid-way, so the caller can name every bad item at once.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from clipserve.backends.base import Backend
from clipserve.engine.fetch import FetchBudget, FetchPool
from clipserve.engine.memory import release_free_memory
from clipserve.engine.output_kind import output_kind
from clipserve.engine.priority_pool import PriorityPool
from clipserve.engine.room import Room
from clipserve.engine.scheduler import Scheduler, Task
from clipserve.engine.small_requests import SMALL

#: decoded minibatches of one request queued at the model thread at once (bounds a request's memory)
AHEAD = 2


@dataclass(frozen=True)
class ImageSource:
    """One image: `decode(data)` gives its pixels; `fetch()`, when set, gets the bytes `decode` takes
    (a URL or a file); without it `decode(None)` works from what the request carried."""

    decode: Callable[[bytes | None], np.ndarray]
    fetch: Callable[[], bytes] | None = None


@dataclass
class EncodeResult:
    """Embeddings for the items that worked (row i belongs to item `indices[i]`) and why the others failed;
    a multi-vector model's are a list of [tokens_i, D] arrays (output_kind.py)."""

    embeddings: np.ndarray | list[np.ndarray]
    indices: list[int]
    failures: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class StageTimes:
    """Seconds spent per stage, for metrics (waiting for preprocessing; waiting for the model)."""

    preprocess: float = 0.0
    inference: float = 0.0


class EncodePipeline:
    """Encodes for one replica: fetch and preprocessing pools, and the scheduler that runs every forward pass."""

    def __init__(
        self,
        backend: Backend,
        minibatch_size: int = 32,
        num_workers: int = 4,
        batch_wait: float | None = None,
        others_in_flight: Callable[[], bool] = lambda: False,
        fetch_threads: int = 16,
        fetch_budget: FetchBudget = FetchBudget(),
        on_wait: Callable[[str, float], None] = lambda kind, seconds: None,
        on_pass: Callable[[str, int, float], None] = lambda kind, rows, seconds: None,
    ):
        self.backend = backend
        self.output = output_kind(backend)  # one vector per input, or a vector per token
        self.minibatch_size = minibatch_size
        self.tokenizer = backend.tokenizer
        self.fetch_budget = fetch_budget
        self._pool = PriorityPool(num_workers)  # decodes in the order room is given (room.py)
        self._fetches = FetchPool(fetch_threads)
        # decoded images waiting for the model, all requests together (each pixel array is large); a small
        # newcomer (a query image) may take 8 rows more, so it does not wait for room (room.py)
        self._room = Room(max(4 * minibatch_size, 64), reserve=8, small=SMALL)
        # A forward pass of images on a CPU runs `cpu_image_chunk` images (backends/base.py): the scheduler
        # interleaves requests at that grain, so a small request waits for one such pass, not a minibatch.
        image_batch = min(minibatch_size, backend.cpu_image_chunk) if backend.device == 'cpu' else minibatch_size
        self.scheduler = Scheduler(
            {
                'images': Task(
                    _releasing_memory(backend.encode_images),
                    image_batch,
                    short_for=SMALL if backend.device == 'cpu' else None,
                ),
                # the backend trims padding (Backend.encode_texts), also after requests were merged
                'texts': Task(_releasing_memory(backend.encode_texts), minibatch_size, pad_columns=True),
            },
            max_wait=batch_wait,
            others_in_flight=others_in_flight,
            on_wait=on_wait,
            on_pass=on_pass,
        )

    @property
    def batches_requests(self) -> bool:
        return self.scheduler.batching

    def close(self) -> None:
        """Stop: queued work is cancelled; a forward pass already running finishes (the backend is closed next)."""
        self._pool.shutdown()
        self._fetches.close()
        self.scheduler.close()

    def encode_texts(
        self,
        texts: Sequence[str],
        times: StageTimes | None = None,
        token_counts: list[int] | None = None,
        request: Hashable = None,
        deadline: float | None = None,
    ) -> np.ndarray | list[np.ndarray]:
        """float32 [N, D] embeddings for `texts`, in order (multi-vector: N arrays [tokens_i, D]); `token_counts`,
        when given, is extended with each text's token count as the model sees it (start and end tokens
        included, after truncation).

        Texts are sorted by token length before minibatching (and put back in order after), so each
        minibatch pads only to lengths close to its own: with padding trimmed, short texts never pay
        for a long one that happened to arrive in the same request.
        """
        times = times or StageTimes()
        request = request if request is not None else object()
        out = np.empty((len(texts), *self.backend.output_shape('texts')), dtype=np.float32)
        if not len(texts):
            return self.output.rows(out)
        t0 = time.perf_counter()
        tokens = self.tokenizer(list(texts))
        times.preprocess += time.perf_counter() - t0
        if token_counts is not None:
            token_counts.extend(int(n) for n in tokens.lengths)
        order = np.argsort(tokens.lengths, kind='stable')
        batches = [order[i : i + self.minibatch_size] for i in range(0, len(texts), self.minibatch_size)]
        t1 = time.perf_counter()
        futures = [
            self.scheduler.submit(
                'texts',
                tokens.input_ids[rows],
                tokens.attention_mask[rows],
                request=request,
                deadline=deadline,
                served=i * self.minibatch_size,
            )
            for i, rows in enumerate(batches)
        ]
        try:
            for rows, future in zip(batches, futures):
                out[rows] = future.result()
        finally:
            for future in futures:
                future.cancel()  # after a failure: what has not run yet is not run
        times.inference += time.perf_counter() - t1
        return self.output.rows(out)

    def encode_images(
        self,
        sources: Sequence[ImageSource | Callable[[], np.ndarray]],
        times: StageTimes | None = None,
        request: Hashable = None,
        deadline: float | None = None,
    ) -> EncodeResult:
        """Embeddings for every source that succeeds; failures as (index, reason). A bare callable is a
        source whose decoder takes no bytes (pixels from content already at hand)."""
        times = times or StageTimes()
        request = request if request is not None else object()
        sources = [s if isinstance(s, ImageSource) else ImageSource(decode=_no_bytes(s)) for s in sources]
        fetches = self._fetches.request(self.fetch_budget, deadline)
        windows = [
            range(i, min(i + self.minibatch_size, len(sources))) for i in range(0, len(sources), self.minibatch_size)
        ]
        rows, indices, failures = [], [], []
        queued: deque[tuple[list[Future], list[int]]] = deque()  # minibatches at the model thread, a job per image

        held = [0]  # rows of room taken for the window being decoded, not yet handed on
        taken = [0]  # rows of room this request has had: requests that had less go first (room.py)

        def prepare(window: range) -> list[Future]:
            self._room.take(len(window), deadline, had=taken[0])  # decoded pixels wait here, not in memory
            priority = (taken[0], len(window))  # decoded in the order room goes by
            held[0] = len(window)
            taken[0] += len(window)
            return self._items([sources[i] for i in window], fetches, priority)

        try:
            pending = prepare(windows[0]) if windows else []
            for n, window in enumerate(windows):
                t0 = time.perf_counter()
                results = [future.result() for future in pending]
                times.preprocess += time.perf_counter() - t0
                held[0] = 0
                ok = [(i, pixels) for i, (pixels, error) in zip(window, results) if error is None]
                failures += [(i, error) for i, (_, error) in zip(window, results) if error is not None]
                self._room.give(len(window) - len(ok))
                del results
                if ok:
                    served = len(indices) + sum(len(w) for _, w in queued)
                    queued.append((self._submit_images(ok, request, deadline, served), [i for i, _ in ok]))
                    del ok
                # the next window is fetched and decoded while this one waits for, and runs on, the model
                pending = prepare(windows[n + 1]) if n + 1 < len(windows) else []
                self._collect(queued, AHEAD, rows, indices, times)
            self._collect(queued, 0, rows, indices, times)
        finally:
            fetches.cancel()
            self._room.give(held[0])
            for jobs, _ in queued:
                for job in jobs:
                    job.cancel()  # its room comes back through its done callback
        shape = self.backend.output_shape('images')
        embeddings = np.concatenate(rows) if rows else np.zeros((0, *shape), np.float32)
        return EncodeResult(embeddings=self.output.rows(embeddings), indices=indices, failures=failures)

    def _submit_images(self, ok: list, request: Hashable, deadline: float | None, served: int) -> list[Future]:
        """A job per image: its pixels and its room are given back as soon as it has run, not when the whole
        minibatch has (which, interleaved with other requests', may be many passes later)."""
        jobs = []
        for k, (_, pixels) in enumerate(ok):
            job = self.scheduler.submit('images', pixels[None], request=request, deadline=deadline, served=served + k)
            job.add_done_callback(lambda _: self._room.give(1))
            jobs.append(job)
        return jobs

    def _collect(self, queued: deque, keep: int, rows: list, indices: list, times: StageTimes) -> None:
        """Wait for the oldest minibatches' jobs until `keep` are left queued, in order."""
        while len(queued) > keep:
            jobs, ok_indices = queued.popleft()
            rows += [self._wait(job, times) for job in jobs]
            indices.extend(ok_indices)

    @staticmethod
    def _wait(future: Future, times: StageTimes) -> np.ndarray:
        t1 = time.perf_counter()
        out = future.result()
        times.inference += time.perf_counter() - t1
        return out

    def _items(self, sources: Sequence[ImageSource], fetches, priority=(0, 0)) -> list[Future]:
        """Per source, a future of (pixels, None) or (None, reason): decoded once its bytes are fetched."""
        items = []
        for source in sources:
            if source.fetch is None:
                items.append(self._pool.submit(priority, _guarded, source.decode, None))
                continue
            item: Future = Future()
            fetched = fetches.start(source.fetch)
            fetched.add_done_callback(lambda f, s=source, out=item: self._decode_fetched(f, s, out, priority))
            items.append(item)
        return items

    def _decode_fetched(self, fetched: Future, source: ImageSource, out: Future, priority) -> None:
        if fetched.cancelled():
            out.set_result((None, 'not fetched: the request ended first'))
            return
        error = fetched.exception()
        if error is not None:
            out.set_result((None, _reason(error)))
            return
        try:
            decoding = self._pool.submit(priority, _guarded, source.decode, fetched.result())
        except RuntimeError as stopped:  # the pool is shut down
            out.set_result((None, _reason(stopped)))
            return
        decoding.add_done_callback(
            lambda d: out.set_result((None, 'not decoded: the replica is stopping') if d.cancelled() else d.result())
        )


def _no_bytes(load: Callable[[], np.ndarray]) -> Callable[[bytes | None], np.ndarray]:
    return lambda _data: load()


def _releasing_memory(encode: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`encode`, giving the memory its activations used back to the system afterwards."""

    def run(*arrays: np.ndarray) -> np.ndarray:
        try:
            return encode(*arrays)
        finally:
            release_free_memory()

    return run


def _reason(error: BaseException) -> str:
    if isinstance(error, (ValueError, OSError)):
        return str(error) or type(error).__name__
    return f'{type(error).__name__}: {error}'


def _guarded(decode: Callable[[bytes | None], np.ndarray], data: bytes | None):
    """Run one decoder; any failure becomes that item's reason, so one bad image cannot sink the others."""
    try:
        return decode(data), None
    except Exception as e:  # a decoder bug or MemoryError on one hostile file
        return None, _reason(e)
