"""The local engine: one machine, the model loaded once in this process, decoding in a pool of processes.

The slow parts of embedding a collection are reading and decoding images (CPU, per image) and the model
(one device, per batch). Here the two overlap as the server's request pipeline overlaps them, but with
processes instead of threads (a whole collection is CPU-bound Python work that threads would serialise):
chunks of one batch are sent to the pool ahead of the model, a bounded window of them in flight, so
the model always has the next batch waiting and memory stays bounded. Shards are written as soon as
their last chunk is embedded. A decoder that crashes its process (a hostile file) is retried in a fresh
pool one row at a time, so only that row fails. Ctrl-C stops the pool and leaves only complete shards.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator

from clipserve.jobs.decode import NONE, Decoded, DecodeSettings, decode_rows, ignore_sigint
from clipserve.jobs.job import Job, PartResult, write_part
from clipserve.jobs.progress import Progress
from clipserve.jobs.readers import Part, Row, read_part

CRASHED = 'the image decoder crashed on this row (its worker process died)'


class DecodePool:
    """decode_rows in worker processes (or inline with 0 workers), surviving a worker that dies."""

    def __init__(self, workers: int, settings: DecodeSettings):
        self.workers = workers
        self.settings = settings
        self.pool: ProcessPoolExecutor | None = None
        if workers > 0 and settings.mode != NONE:
            self.pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        # forkserver: workers fork from a clean server process that has imported only the decoder (and
        # not torch, whose threads make forking this process unsafe)
        context = multiprocessing.get_context('forkserver')
        context.set_forkserver_preload(['clipserve.jobs.decode'])
        return ProcessPoolExecutor(self.workers, mp_context=context, initializer=ignore_sigint)

    def submit(self, rows: list[Row]) -> Future | list[Row]:
        if self.pool is None:
            return rows
        try:
            return self.pool.submit(decode_rows, rows, self.settings)
        except BrokenProcessPool:
            return rows  # decoded (carefully) when its result is asked for

    def result(self, handle: Future | list[Row], rows: list[Row]) -> Decoded:
        if self.pool is None:
            return decode_rows(rows, self.settings)
        if isinstance(handle, Future):
            try:
                return handle.result()
            except BrokenProcessPool:
                pass
        return self._isolated(rows)

    def _restart(self) -> None:
        self.close()
        self.pool = self._start()

    def _isolated(self, rows: list[Row]) -> Decoded:
        """After a worker died: the chunk again in a fresh pool, and row by row if it kills that one too."""
        self._restart()
        try:
            return self.pool.submit(decode_rows, rows, self.settings).result()
        except BrokenProcessPool:
            pass
        parts = []
        for row in rows:
            self._restart()
            try:
                parts.append(self.pool.submit(decode_rows, [row], self.settings).result())
            except BrokenProcessPool:
                parts.append(Decoded([CRASHED], [None], [None]))
        self._restart()
        return _concat(parts)

    def close(self) -> None:
        if self.pool is None:
            return
        processes = list((getattr(self.pool, '_processes', None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # workers ignore SIGINT; a running chunk is not worth waiting for
            if process.is_alive():
                process.terminate()
        self.pool = None


def _concat(parts: list[Decoded]) -> Decoded:
    import numpy as np

    errors = [e for p in parts for e in p.errors]
    widths = [w for p in parts for w in p.widths]
    heights = [h for p in parts for h in p.heights]
    pixels = [p.pixels for p in parts if p.pixels is not None]
    images = [i for p in parts for i in (p.images or [])]
    stacked = np.concatenate(pixels) if pixels else None
    return Decoded(errors, widths, heights, pixels=stacked, images=images if images else None)


def _chunks(job: Job, parts: list[Part], size: int) -> Iterator[tuple[Part, list[Row], bool]]:
    """(part, rows, is its last chunk) in order; an empty part is one empty last chunk."""
    for part in parts:
        chunk: list[Row] = []
        for row in read_part(job.plan.kind, part):
            chunk.append(job.check_row(row))
            if len(chunk) == size:
                yield part, chunk, False
                chunk = []
        yield part, chunk, True


def run_local(job: Job, embedder, progress: Progress) -> None:
    """Embed every pending part of `job` with `embedder` (a model here, or a server)."""
    options = job.options
    settings = DecodeSettings(
        preprocess=embedder.preprocess,
        policy=options.policy(),
        mode=embedder.decode_mode if job.images else NONE,
        fetch_threads=options.fetch_threads,
    )
    batch = options.resolved_batch()
    pool = DecodePool(options.resolved_workers(), settings)
    window: deque = deque()
    chunks = _chunks(job, job.pending, batch)
    depth = 2 * max(1, pool.workers) + 1
    results: dict[int, PartResult] = {}
    try:

        def refill():
            while len(window) < depth:
                item = next(chunks, None)
                if item is None:
                    return
                part, rows, last = item
                window.append((part, rows, last, pool.submit(rows)))

        refill()
        while window:
            part, rows, last, handle = window.popleft()
            decoded = pool.result(handle, rows)
            refill()
            result = results.setdefault(part.index, PartResult([]))
            offset = len(result.rows)
            result.rows += rows
            result.errors += decoded.errors
            result.widths += decoded.widths
            result.heights += decoded.heights
            result.img += [None] * len(rows)
            result.txt += [None] * len(rows)
            images = 0
            if job.images:
                ok = decoded.ok
                vectors, failures = embedder.encode_images(decoded)
                kept = [i for k, i in enumerate(ok) if k not in failures]
                for k, reason in failures.items():
                    result.fail(offset + ok[k], reason)
                for i, vector in zip(kept, vectors):
                    result.img[offset + i] = vector
                images = len(kept)
            progress.update(len(rows), 0, images, 0)
            if last:
                texts = _embed_texts(job, embedder, result)
                embedded, failed = write_part(job, part.index, result, embedder.embed_dim)
                progress.update(0, failed, 0, texts, shards=1)
                del results[part.index]
    finally:
        pool.close()


def _embed_texts(job: Job, embedder, result: PartResult) -> int:
    if not job.texts:
        return 0
    todo = [i for i, error in enumerate(result.errors) if error is None]
    vectors, failures = embedder.encode_texts([result.rows[i].caption for i in todo])
    kept = [i for k, i in enumerate(todo) if k not in failures]
    for k, reason in failures.items():
        result.fail(todo[k], reason)
    for i, vector in zip(kept, vectors):
        result.txt[i] = vector
    return len(kept)
