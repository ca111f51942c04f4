"""A NumPy transcription of Pillow's fixed-point resampler, for a window of a resize.

For very elongated images, Pillow's resize of the whole image followed by the crop allocates far more
than the crop keeps; `resize_crop_exact` computes only the kept window and gives the same bytes as
Pillow's full resize followed by the crop. Whether Pillow resamples horizontally or vertically first
(which changes the rounding) is calibrated against the installed Pillow once per process
(`calibrated_pass_order`); when no rule matches, the caller falls back to Pillow itself.

Our own, not Pillow's `resize(size, box=window)`: that gives other bytes than the whole-image resize
followed by the crop (float32 box edges; its pass order follows the window's shape), as
tests/unit/test_resample.py shows, and preprocessing must match open_clip's bytes.

Only the standard library, NumPy and Pillow are imported here, on purpose.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import numpy as np
from PIL import Image

RESAMPLE = {
    'bicubic': Image.Resampling.BICUBIC,
    'bilinear': Image.Resampling.BILINEAR,
}

# Modes Pillow resamples with its 8-bit fixed-point code, which resize_crop_exact
# reproduces.  RGBA/LA go through premultiplied RGBa/La, exactly as Image.resize does.
PREMULTIPLIED = {'RGBA': 'RGBa', 'LA': 'La'}
EXACT_MODES = frozenset({'L', 'RGB', 'CMYK'}) | frozenset(PREMULTIPLIED)

# Pillow's fixed-point precision for 8-bit resampling (Resample.c: 32 - 8 - 2).
_PRECISION_BITS = 22


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Pillow's bicubic kernel (a = -0.5), written with its operation order so rounding agrees."""
    x = np.abs(x)
    near = ((1.5 * x - 2.5) * x) * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * -0.5
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _bilinear(x: np.ndarray) -> np.ndarray:
    """Pillow's triangle kernel."""
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_KERNELS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    'bicubic': (_bicubic, 2.0),
    'bilinear': (_bilinear, 1.0),
}


def _axis_taps(in_size: int, out_size: int, start: int, count: int, interpolation: str):
    """Source indices and fixed-point weights for outputs [start, start + count) of an axis resize.

    This is Pillow's precompute_coeffs + normalize_coeffs_8bpc for a whole-image
    resize, evaluated only at the outputs we keep.  Pillow's ``box`` argument
    cannot be used instead: it passes box edges as float32, which moves the
    sample centres enough to change output bytes.
    """
    kernel, kernel_support = _KERNELS[interpolation]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = kernel_support * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(start, start + count, dtype=np.float64) + 0.5) * scale
    first = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    last = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    used = np.arange(ksize)[None, :] < (last - first)[:, None]
    index = first[:, None] + np.arange(ksize)[None, :]
    offsets = (index.astype(np.float64) - center[:, None] + 0.5) * (1.0 / filterscale)
    weights = np.where(used, kernel(offsets), 0.0)
    total = np.zeros(count, dtype=np.float64)
    for tap in range(ksize):  # sequential sum, as in C, so the rounding matches
        total = total + weights[:, tap]
    weights = np.where(total[:, None] != 0.0, weights / np.where(total == 0.0, 1.0, total)[:, None], weights)
    scaled = weights * float(1 << _PRECISION_BITS)
    fixed = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int32)
    fixed[~used] = 0
    return np.minimum(index, in_size - 1), fixed


def _resample_axis(pixels: np.ndarray, index: np.ndarray, fixed: np.ndarray, axis: int) -> np.ndarray:
    """One separable pass with Pillow's 8-bit arithmetic: int32 sums, +0.5 rounding, clamp."""
    shape = [1] * pixels.ndim
    shape[axis] = index.shape[0]
    acc = None
    for tap in range(index.shape[1]):  # loop over filter taps, vectorised over pixels
        term = np.take(pixels, index[:, tap], axis=axis).astype(np.int32) * fixed[:, tap].reshape(shape)
        acc = term if acc is None else acc + term
    acc += 1 << (_PRECISION_BITS - 1)
    return np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)


def vertical_first_pillow13(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Newer Pillow (13 here, PR #9549) does the vertical pass first if height shrinks over twice as much."""
    return new_height < height and height - new_height > 2 * (width - new_width)


def _vertical_first_never(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Older Pillow always runs the horizontal pass first."""
    return False


_PASS_ORDER_RULES = (vertical_first_pillow13, _vertical_first_never)


def resize_crop_exact(
    image: Image.Image,
    new_size: tuple[int, int],
    crop: tuple[int, int, int, int],
    interpolation: str,
    vertical_first: Callable[[int, int, int, int], bool],
) -> Image.Image:
    """``image.resize(new_size).crop(crop)`` for 8-bit modes, computing only the crop window.

    Pillow's whole-image resize of a 200:1 panorama allocates the full resized
    strip plus a pass intermediate (tens to hundreds of MB) only for the crop to
    discard nearly all of it.  Here only the source rectangle under the filter
    footprint of the window is read.  Each pass rounds to uint8, so the passes
    run in the order Pillow picks (``vertical_first``) to give identical bytes.
    """
    if new_size == image.size:  # Image.resize returns a plain copy then, with no premultiply round trip
        return image.crop(crop)
    width, height = image.size
    new_width, new_height = new_size
    left, top, right, bottom = crop
    x_taps = y_taps = None  # None: that axis keeps its size, so Pillow skips the pass
    if new_width != width:
        x_taps = _axis_taps(width, new_width, left, right - left, interpolation)
    if new_height != height:
        y_taps = _axis_taps(height, new_height, top, bottom - top, interpolation)
    x0, x1 = (int(x_taps[0].min()), int(x_taps[0].max()) + 1) if x_taps is not None else (left, right)
    y0, y1 = (int(y_taps[0].min()), int(y_taps[0].max()) + 1) if y_taps is not None else (top, bottom)
    region = image.crop((x0, y0, x1, y1))
    mode = PREMULTIPLIED.get(image.mode, image.mode)
    if mode != image.mode:
        region = region.convert(mode)  # Image.resize premultiplies alpha the same way
    pixels = np.asarray(region)
    del region
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    passes = [(1, x_taps, x0), (0, y_taps, y0)]
    if x_taps is not None and y_taps is not None and vertical_first(width, height, new_width, new_height):
        passes.reverse()
    for axis, taps, origin in passes:
        if taps is not None:
            pixels = _resample_axis(pixels, taps[0] - origin, taps[1], axis)
    out = Image.frombytes(mode, (right - left, bottom - top), np.ascontiguousarray(pixels).tobytes())
    return out.convert(image.mode) if mode != image.mode else out


@functools.lru_cache(maxsize=1)
def calibrated_pass_order() -> Optional[Callable[[int, int, int, int], bool]]:
    """The pass-order rule the installed Pillow follows, or None to disable the exact path.

    Pillow's pass order changed between versions and may change again, so we
    check our transcription against the real thing once, on small noise images
    whose output depends on the order, instead of trusting a version number.
    """
    rng = np.random.default_rng(0)
    probe = Image.fromarray(rng.integers(0, 256, (120, 50, 3), dtype=np.uint8))
    sizes = [(21, 40), (30, 100), (70, 150), (40, 13)]  # by Pillow 13's rule: V first, then H first
    for rule in _PASS_ORDER_RULES:
        if all(
            np.array_equal(
                np.asarray(probe.resize(size, RESAMPLE[interpolation])),
                np.asarray(resize_crop_exact(probe, size, (0, 0) + size, interpolation, rule)),
            )
            for size in sizes
            for interpolation in RESAMPLE
        ):
            return rule
    return None
