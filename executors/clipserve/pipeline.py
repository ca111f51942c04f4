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
from clipserve.batching import ModelThread, Task
from clipserve.memory import release_free_memory

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
    """Encodes for one replica: preprocessing in a thread pool, forward passes on the replica's model
    thread (clipserve.batching), where concurrent requests share them when `batch_wait` is set."""

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
        self.tokenizer = backend.tokenizer
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix='clipserve-preprocess')
        # every forward pass on one thread, which also merges concurrent requests when batch_wait is set
        self.model_thread = ModelThread(
            {
                'images': Task(_releasing_memory(backend.encode_images)),
                # the backend trims padding (Backend.encode_texts), also after the thread merged requests
                'texts': Task(_releasing_memory(backend.encode_texts), pad_columns=True),
            },
            max_batch=minibatch_size,
            max_wait=batch_wait,
            others_in_flight=others_in_flight,
        )

    @property
    def batches_requests(self) -> bool:
        return self.model_thread.batching

    def _run_images(self, pixels: np.ndarray) -> np.ndarray:
        return self.model_thread('images', pixels)

    def _run_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.model_thread('texts', input_ids, attention_mask)

    def close(self) -> None:
        """Stop: queued work is cancelled; a forward pass already running finishes (the backend is closed next)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.model_thread.close()

    def encode_texts(
        self, texts: Sequence[str], times: StageTimes | None = None, token_counts: list[int] | None = None
    ) -> np.ndarray:
        """float32 [N, D] embeddings for `texts`, in order; `token_counts`, when given, is extended with
        each text's token count as the model sees it (start and end tokens included, after truncation).

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
        if token_counts is not None:
            token_counts.extend(int(n) for n in tokens.lengths)
        order = np.argsort(tokens.lengths, kind='stable')
        for start in range(0, len(texts), self.minibatch_size):
            rows = order[start : start + self.minibatch_size]
            t1 = time.perf_counter()
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


def _releasing_memory(encode: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`encode`, giving the memory its activations used back to the system afterwards."""

    def run(*arrays: np.ndarray) -> np.ndarray:
        try:
            return encode(*arrays)
        finally:
            release_free_memory()

    return run


def _guarded(loader: ImageLoader):
    """Run one loader; any failure becomes that item's reason, so one bad image cannot sink the others."""
    try:
        return loader(), None
    except (ValueError, OSError) as e:
        return None, str(e) or type(e).__name__
    except Exception as e:  # a decoder bug or MemoryError on one hostile file
        return None, f'{type(e).__name__}: {e}'
