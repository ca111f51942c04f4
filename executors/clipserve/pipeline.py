"""Minibatched encoding with preprocessing overlapped with inference. No Jina here.

Items come in as texts or as zero-argument image loaders (which read, decode and preprocess one
image, raising on bad input). Images of minibatch k+1 are preprocessed in a thread pool while the
backend runs minibatch k; Pillow and numpy release the GIL, so this overlaps for real. Failures are
collected per item, never raised mid-way, so the caller can name every bad item at once.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from clipserve.backends.base import Backend
from clipserve.batching import Coalescer
from clipserve.memory import release_free_memory
from clipserve.models.tokenizer import Tokenizer

ImageLoader = Callable[[], np.ndarray]


@dataclass
class EncodeResult:
    """Embeddings for the items that worked (row i belongs to item `indices[i]`) and why the others failed."""

    embeddings: np.ndarray
    indices: list[int]
    failures: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class StageTimes:
    """Seconds spent per stage, for metrics."""

    preprocess: float = 0.0
    inference: float = 0.0


class EncodePipeline:
    """Encodes for one replica. With `batch_wait` set, concurrent requests share forward passes
    (see clipserve.batching); otherwise each call runs the model itself, one at a time."""

    def __init__(
        self,
        backend: Backend,
        minibatch_size: int = 32,
        num_workers: int = 4,
        batch_wait: float | None = None,
        others_in_flight: Callable[[], bool] = lambda: False,
    ):
        self.backend = backend
        self.minibatch_size = minibatch_size
        self.tokenizer = Tokenizer(context_length=backend.context_length)
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix='clipserve-preprocess')
        # one forward pass at a time per replica, always on the same thread (see _forward)
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix='clipserve-model')
        self._coalescers = []
        if batch_wait is not None:
            self._run_images = Coalescer(
                self._forward(backend.encode_images),
                minibatch_size,
                batch_wait,
                others_in_flight,
                name='clipserve-image-batcher',
            )
            self._run_texts = Coalescer(
                self._forward(backend.encode_texts),
                minibatch_size,
                batch_wait,
                others_in_flight,
                pad_columns=True,
                name='clipserve-text-batcher',
            )
            self._coalescers = [self._run_images, self._run_texts]
        else:
            self._run_images = self._forward(backend.encode_images)
            self._run_texts = self._forward(backend.encode_texts)

    def _forward(self, encode: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        """`encode`, one call at a time on the replica's model thread, giving the memory its
        activations used back afterwards.

        One thread rather than a lock around whichever request thread comes: OpenMP gives every
        thread that starts a parallel region its own team of workers, and the math libraries keep
        buffers per thread. Eight threads taking turns at a ViT-B-32 (torch, CPU, one process) grew
        it by 211 MB and eight OpenMP workers; the same passes on one thread by 14 MB.
        """

        def run_and_release(*arrays: np.ndarray) -> np.ndarray:
            try:
                return encode(*arrays)
            finally:
                release_free_memory()

        def run(*arrays: np.ndarray) -> np.ndarray:
            return self._model_thread.submit(run_and_release, *arrays).result()

        return run

    def close(self) -> None:
        """Stop: queued work is cancelled; a forward pass already running finishes (the backend is closed next)."""
        for coalescer in self._coalescers:
            coalescer.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._model_thread.shutdown(wait=True, cancel_futures=True)

    def encode_texts(self, texts: Sequence[str], times: StageTimes | None = None) -> np.ndarray:
        """float32 [N, D] embeddings for `texts`, in order.

        Texts are sorted by token length before minibatching (and put back in order after), so each
        minibatch pads only to lengths close to its own: with padding trimmed, short texts never pay
        for a long one that happened to arrive in the same request.
        """
        times = times or StageTimes()
        out = np.empty((len(texts), self.backend.embed_dim), dtype=np.float32)
        t0 = time.perf_counter()
        tokens = self.tokenizer(list(texts)) if len(texts) else None
        times.preprocess += time.perf_counter() - t0
        if tokens is None:
            return out
        order = np.argsort(tokens.lengths, kind='stable')
        for start in range(0, len(texts), self.minibatch_size):
            rows = order[start : start + self.minibatch_size]
            t1 = time.perf_counter()
            # the backend trims padding (Backend.encode_texts), also after the batcher merged requests
            out[rows] = self._run_texts(tokens.input_ids[rows], tokens.attention_mask[rows])
            times.inference += time.perf_counter() - t1
        return out

    def _preprocess_batch(self, loaders: Sequence[ImageLoader]):
        return [self._pool.submit(_guarded, loader) for loader in loaders]

    def encode_images(self, loaders: Sequence[ImageLoader], times: StageTimes | None = None) -> EncodeResult:
        """Embeddings for every loader that succeeds; failures as (index, reason)."""
        times = times or StageTimes()
        starts = list(range(0, len(loaders), self.minibatch_size))
        rows, indices, failures = [], [], []
        pending = self._preprocess_batch(loaders[: self.minibatch_size]) if starts else []
        for n, start in enumerate(starts):
            t0 = time.perf_counter()
            results = [future.result() for future in pending]
            times.preprocess += time.perf_counter() - t0
            # Queue the next minibatch's decoding before running this one through the model.
            if n + 1 < len(starts):
                nxt = starts[n + 1]
                pending = self._preprocess_batch(loaders[nxt : nxt + self.minibatch_size])
            ok = [(start + i, pixels) for i, (pixels, error) in enumerate(results) if error is None]
            failures += [(start + i, error) for i, (_, error) in enumerate(results) if error is not None]
            if ok:
                batch = np.stack([pixels for _, pixels in ok])
                del results
                t1 = time.perf_counter()
                rows.append(self._run_images(batch))
                times.inference += time.perf_counter() - t1
                indices += [i for i, _ in ok]
                del batch, ok
        embeddings = np.concatenate(rows) if rows else np.zeros((0, self.backend.embed_dim), np.float32)
        return EncodeResult(embeddings=embeddings, indices=indices, failures=failures)


def _guarded(loader: ImageLoader):
    """Run one loader; any failure becomes that item's reason, so one bad image cannot sink the others."""
    try:
        return loader(), None
    except (ValueError, OSError) as e:
        return None, str(e) or type(e).__name__
    except Exception as e:  # a decoder bug or MemoryError on one hostile file
        return None, f'{type(e).__name__}: {e}'
