"""Freed heap memory goes back to the operating system after forward passes."""

import platform
import threading

import numpy as np
import pytest

from clipserve.engine.memory import release_free_memory

from ..compare import assert_close


def _rss_anon_mb() -> float:
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('RssAnon')) / 1024


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc', reason='malloc_trim is glibc')
def test_freed_arena_memory_is_returned():
    """Chunks a worker thread allocated and freed stay in its arena until trimmed."""
    kept = []

    def churn():
        chunks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MB, below the mmap threshold
        kept.extend(chunks[-1::-500])  # a few survivors pin the arena's top, as real traffic does
        del chunks

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    before = _rss_anon_mb()
    assert release_free_memory() is True
    assert before - _rss_anon_mb() > 100, 'malloc_trim returned less than 100 of ~190 freed MB'
    assert len(kept) == 6


def test_cpu_image_batches_run_in_chunks_with_the_same_result(tiny_backend):
    pixels = np.random.default_rng(1).normal(size=(20, 3, 224, 224)).astype(np.float32)
    calls = tiny_backend.model_calls
    together = tiny_backend.encode_images(pixels)
    assert tiny_backend.model_calls == calls + 1  # one minibatch, however it is chunked
    assert tiny_backend.cpu_image_chunk < len(pixels)
    one_by_one = np.concatenate([tiny_backend.encode_images(pixels[i : i + 1]) for i in range(len(pixels))])
    assert_close(together, one_by_one, rel=1e-5)
