"""benchmarks/gpu_check.py's measuring pieces: the parity limits, the check's record (results, SKIP/FAIL lines,
its time budget), inputs, and the throughput of one backend at each batch size as a fraction of the peak."""

from __future__ import annotations

import time
import traceback

import numpy as np

from benchmarks.common import items_per_second

IMAGE_FLOPS = {'ViT-B-32': 8.82e9}  # open_clip docs/model_profile.csv, per item
TEXT_FLOPS_77 = {'ViT-B-32': 5.96e9}  # at 77 tokens; scaled by the real token count
DEFAULT_PEAK = 989e12
TINY = 'clipserve-tiny::random'
CAPTIONS = [
    'a photo of a small brown dog running on the beach at sunset',
    'two people riding bicycles along a busy city street in the rain',
    'a bowl of fresh fruit on a wooden kitchen table near a window',
    'an old red tractor parked in a green field under a cloudy sky',
]
LIMITS = {'fp16': 1e-2, 'bf16': 1e-2, 'fp32': 1e-3}


class Check:
    """Collects results, SKIP/FAIL lines and the time left, so each section can decide whether to run."""

    def __init__(self, budget: float):
        self.deadline = time.monotonic() + budget
        self.parity, self.throughput, self.notes, self.failures = [], [], [], []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip(self, what: str, why: str) -> None:
        line = f'SKIP: {what}: {why}'
        print(line, flush=True)
        self.notes.append(line)

    def enough_time(self, what: str, seconds: float) -> bool:
        if self.left() < seconds:
            self.skip(what, f'only {self.left():.0f}s of the time budget left (needs ~{seconds:.0f}s)')
            return False
        return True

    def compare(self, backend: str, dtype: str, kind: str, got: np.ndarray, want: np.ndarray, limit=None) -> None:
        limit = LIMITS[dtype] if limit is None else limit
        distance = cosine_distance(got, want)
        ok = bool(distance <= limit)
        self.parity.append(
            {
                'backend': backend,
                'dtype': dtype,
                'input': kind,
                'max_cosine_distance': distance,
                'limit': limit,
                'ok': ok,
            }
        )
        print(
            f'{"ok  " if ok else "FAIL"} parity {backend} {dtype} {kind}: max cosine distance {distance:.2e} '
            f'(limit {limit:g})',
            flush=True,
        )
        if not ok:
            self.failures.append(f'{backend} {dtype} {kind} parity {distance:.2e} > {limit:g}')

    def fail(self, what: str, error: BaseException) -> None:
        print(f'FAIL {what}: {type(error).__name__}: {error}', flush=True)
        traceback.print_exc()
        self.failures.append(f'{what}: {type(error).__name__}: {error}')


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((1.0 - (a * b).sum(axis=1)).max())


def inputs(size: int, n: int, rng=None):
    """n random normalised images and n captions (tokenised, with the mask the executor sends)."""
    from clipserve.models.tokenizer import Tokenizer

    rng = rng or np.random.default_rng(0)
    pixels = rng.normal(size=(n, 3, size, size)).astype(np.float32)
    tokens = Tokenizer()([CAPTIONS[i % len(CAPTIONS)] for i in range(n)])
    return pixels, tokens.input_ids, tokens.attention_mask


def embeddings(backend, pixels, ids, mask):
    return backend.encode_images(pixels), backend.encode_texts(ids, mask)


def measure(check: Check, label: str, dtype: str, backend, model: str, batches, seconds: float, peak: float) -> None:
    """items/s at each batch for images and texts, and the fraction of `peak` that is."""
    arch = model.split('::')[0]
    for batch in batches:
        if not check.enough_time(f'{label} {dtype} batch {batch} throughput', 3 * seconds + 5):
            return
        pixels, ids, mask = inputs(backend.image_size, batch)
        tokens_run = int(mask.sum(axis=1).max()) if backend.trims_padding else ids.shape[1]
        for kind, fn, flops in (
            ('images', lambda: backend.encode_images(pixels), IMAGE_FLOPS.get(arch)),
            (
                'texts',
                lambda: backend.encode_texts(ids, mask),
                TEXT_FLOPS_77.get(arch) and TEXT_FLOPS_77[arch] * tokens_run / 77,
            ),
        ):
            rate = items_per_second(fn, batch, min_seconds=seconds, warmup=2)
            row = {
                'backend': label,
                'dtype': dtype,
                'input': kind,
                'batch': batch,
                'items_per_s': rate,
                'tokens_run': tokens_run if kind == 'texts' else None,
            }
            if flops:
                row['tflops'] = rate * flops / 1e12
                row['fraction_of_peak'] = rate * flops / peak
            check.throughput.append(row)
            share = f', {row["tflops"]:.1f} TFLOP/s = {100 * row["fraction_of_peak"]:.2f}% of peak' if flops else ''
            print(f'     {label} {dtype} {kind} batch {batch}: {rate:,.1f} items/s{share}', flush=True)
