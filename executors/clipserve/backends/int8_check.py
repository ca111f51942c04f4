"""int8 is served only after it is measured against fp32 on the CPU it runs on.

Integer kernels differ between CPUs (AVX2's 16-bit pair sums, AVX-512 VNNI, AMX), so a quantized model
that keeps embeddings on one machine can break them on another. Before a replica serves `dtype: int8`,
the same generated images and captions go through the fp32 and the int8 towers on this CPU; int8 is
refused at start, with the figures, when an embedding drifts from fp32 past the bounds below or when an
input's embedding depends on what shares its batch. CLIPSERVE_INT8_FORCE=1 serves it anyway (logged).
The inputs are synthetic, so the check catches broken arithmetic, not the accuracy a trained model loses
on real data (benchmarks/precision.py --ckpt measures that on your weights and images).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from clipserve import environment
from clipserve.backends.cpu_features import cpu_features
from clipserve.errors import BackendUnavailableError

FORCE_ENV = environment.INT8_FORCE.name
MIN_COSINE = 0.995  # each image and text embedding against fp32's
MIN_BATCH_COSINE = 0.9999  # an input alone against the same input in a batch
IMAGES = 12
CAPTIONS = (
    'a photo of a dog',
    'two cats sleeping on a red sofa',
    'a diagram of a neural network',
    'a city street at night with neon signs and wet pavement reflecting the lights',
    'a bowl of fruit',
    'an aerial view of a coastline with cliffs',
    'a hand-written note',
    'a cyclist in a yellow jacket waiting at a red light',
    'snow',
    'a close-up of a circuit board with many small components',
    'two people playing chess in a park',
    'a',
)


@dataclass(frozen=True)
class Int8Report:
    """int8 against fp32 on this CPU."""

    image_cosine_min: float
    text_cosine_min: float
    batch_cosine_min: float
    image_speedup: float
    text_speedup: float
    cpu: str

    @property
    def failures(self) -> list[str]:
        found = []
        if self.image_cosine_min < MIN_COSINE:
            found.append(f'image embeddings drift from fp32 (min cosine {self.image_cosine_min:.5f} < {MIN_COSINE})')
        if self.text_cosine_min < MIN_COSINE:
            found.append(f'text embeddings drift from fp32 (min cosine {self.text_cosine_min:.5f} < {MIN_COSINE})')
        if self.batch_cosine_min < MIN_BATCH_COSINE:
            found.append(
                f'an embedding depends on its batch mates (min cosine {self.batch_cosine_min:.6f} < {MIN_BATCH_COSINE})'
            )
        return found

    def describe(self) -> str:
        return (
            f'int8 vs fp32 on this CPU ({self.cpu}): min cosine images {self.image_cosine_min:.5f}, '
            f'texts {self.text_cosine_min:.5f}, alone vs batched {self.batch_cosine_min:.6f}; '
            f'speed images {self.image_speedup:.2f}x, texts {self.text_speedup:.2f}x'
        )

    def as_dict(self) -> dict:
        return {
            'image_cosine_min': round(self.image_cosine_min, 6),
            'text_cosine_min': round(self.text_cosine_min, 6),
            'batch_cosine_min': round(self.batch_cosine_min, 7),
            'image_speedup': round(self.image_speedup, 3),
            'text_speedup': round(self.text_speedup, 3),
            'cpu': self.cpu,
        }


def check_int8(fp32, int8) -> Int8Report:
    """Compare two backends of one model (anything with `encode_images`, `encode_texts(ids, mask)`,
    `tokenizer` and `preprocess`) on generated images and CAPTIONS, as the server calls them."""
    from clipserve.models.preprocess import preprocess_image

    pixels = np.stack([preprocess_image(image, fp32.preprocess) for image in synthetic_images()])
    tokens = fp32.tokenizer(list(CAPTIONS))
    ids, mask = tokens.input_ids, tokens.attention_mask
    want_images, got_images = fp32.encode_images(pixels), int8.encode_images(pixels)
    want_texts, got_texts = fp32.encode_texts(ids, mask), int8.encode_texts(ids, mask)
    # second runs, timed (the first ones warmed the kernels up)
    fp32_image_time, int8_image_time = _seconds(fp32.encode_images, pixels), _seconds(int8.encode_images, pixels)
    fp32_text_time, int8_text_time = _seconds(fp32.encode_texts, ids, mask), _seconds(int8.encode_texts, ids, mask)
    alone = [int8.encode_images(pixels[i : i + 1])[0] for i in range(2)]
    for i in (3, 11):  # the longest caption and the shortest: alone, each runs at its own length
        one = fp32.tokenizer([CAPTIONS[i]])
        alone.append(int8.encode_texts(one.input_ids, one.attention_mask)[0])
    batched = [got_images[0], got_images[1], got_texts[3], got_texts[11]]
    return Int8Report(
        image_cosine_min=_min_cosine(got_images, want_images),
        text_cosine_min=_min_cosine(got_texts, want_texts),
        batch_cosine_min=_min_cosine(np.stack(alone), np.stack(batched)),
        image_speedup=fp32_image_time / int8_image_time,
        text_speedup=fp32_text_time / int8_text_time,
        cpu=cpu_features().describe(),
    )


def enforce(report: Int8Report, backend: str, environ=None) -> str:
    """The line to log when int8 may serve; raises BackendUnavailableError when it may not."""
    environ = os.environ if environ is None else environ
    failures = report.failures
    if not failures:
        return report.describe()
    if environment.INT8_FORCE.on(environ):
        return f'{report.describe()}; SERVED ANYWAY ({FORCE_ENV}=1): {"; ".join(failures)}'
    raise BackendUnavailableError(
        f'dtype int8 on the {backend} backend is refused on this CPU: {"; ".join(failures)}. Measured: '
        f'{report.describe()}. Serve fp32 (or bf16 where the CPU has it), or set {FORCE_ENV}=1 to serve int8 anyway.'
    )


def require_int8_dot_products(backend: str, environ=None) -> None:
    """Refuse int8 on a CPU without int8 dot-product instructions (VNNI, AMX) where `backend`'s int8 then
    computes in fp32 anyway (OpenVINO dequantizes the int8 weights: no faster than fp32, measured)."""
    environ = os.environ if environ is None else environ
    features = cpu_features()
    if features.int8_dot or environment.INT8_FORCE.on(environ):
        return
    raise BackendUnavailableError(
        f'dtype int8 on the {backend} backend is refused on this CPU ({features.describe()}): without int8 '
        'dot-product instructions (VNNI or AMX) it dequantizes the int8 weights and computes in fp32, no faster '
        f"than fp32. Use the onnx backend's int8 or fp32, or set {FORCE_ENV}=1 to serve it anyway."
    )


def synthetic_images(count: int = IMAGES, size: tuple[int, int] = (320, 240)):
    """PIL images of smooth colour fields with a few shapes: varied enough to spread embeddings, reproducible."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(8)
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    images = []
    for _ in range(count):
        a, b, c = rng.uniform(0.2, 2.0, 3)
        field = np.stack([np.sin(x / (40 * a)), np.cos(y / (30 * b)), np.sin((x + y) / (50 * c))], -1)
        image = Image.fromarray(((field + 1) * 127.5).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 5))):
            x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
            box = (x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 100)))
            draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        images.append(image)
    return images


def _seconds(encode: Callable[..., np.ndarray], *arrays) -> float:
    started = time.perf_counter()
    encode(*arrays)
    return max(time.perf_counter() - started, 1e-9)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))).min())


def verify_int8(backend, fp32_backend) -> None:
    """Measure the int8 `backend` against `fp32_backend` (then closed), refuse it or record why it serves:
    the report goes into its precision's reason, which the ready line and /clipserve/info show."""
    try:
        report = check_int8(fp32_backend, backend)
    finally:
        fp32_backend.close()
    line = enforce(report, backend.name)
    backend.int8_report = report
    backend.precision = dataclasses.replace(backend.precision, reason=f'{backend.precision.reason}; {line}')
    backend.model_calls = backend.images_encoded = backend.texts_encoded = 0
