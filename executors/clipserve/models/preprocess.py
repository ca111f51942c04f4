"""Torch-free CLIP image preprocessing that reproduces open_clip's eval transform.

The ONNX and TensorRT backends run without torch, yet they must feed the model
the same tensor that ``open_clip.image_transform(S, is_train=False)`` builds, or
embeddings drift from the torch backend.  That transform is, for a PIL image:

1. ``Resize(S, BICUBIC)``: shorter side -> S, longer side -> ``int(S * long / short)``
   (``Resize((S, S))`` in 'squash' mode), done by Pillow's ``Image.resize``;
2. ``CenterCrop(S)`` with offsets ``int(round((size - S) / 2.0))``;
3. ``convert('RGB')`` -- after the crop, so the resize runs in the source mode
   (premultiplied for RGBA, nearest-neighbour for palette images, ...);
4. ``ToTensor`` (uint8 / 255 as float32, CHW) and ``Normalize`` ((x - mean) / std).

We call the same Pillow operations, so results match to the float32 rounding of
the last step.  The one place we do not call Pillow is the memory guard for very
elongated images (see ``_resize_crop_exact``): there we compute only the kept
window with a NumPy transcription of Pillow's fixed-point resampler, which gives
the same bytes as Pillow's full resize followed by the crop.  It is checked
against the installed Pillow once per process and switched off if they disagree.

Decoding is defensive, because image bytes come from clients: declared sizes are
checked before pixels are decoded, and every decode failure becomes ``ImageError``.

Only the standard library, NumPy and Pillow are imported here, on purpose.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = [
    'OPENAI_MEAN',
    'OPENAI_STD',
    'PreprocessConfig',
    'ImageError',
    'open_image',
    'image_from_array',
    'preprocess_image',
    'preprocess_bytes',
]

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

_RESAMPLE = {
    'bicubic': Image.Resampling.BICUBIC,
    'bilinear': Image.Resampling.BILINEAR,
}

# Above this many pixels, Pillow's plain resize of the whole image (its first-pass
# intermediate plus the output) is mostly thrown away by the crop, so we compute
# only the kept window instead.  4M pixels is ~16 MB at Pillow's 4 bytes/pixel.
_PLAIN_RESIZE_MAX_PIXELS = 4_000_000

# Modes Pillow resamples with its 8-bit fixed-point code, which _resize_crop_exact
# reproduces.  RGBA/LA go through premultiplied RGBa/La, exactly as Image.resize does.
_PREMULTIPLIED = {'RGBA': 'RGBa', 'LA': 'La'}
_EXACT_MODES = frozenset({'L', 'RGB', 'CMYK'}) | frozenset(_PREMULTIPLIED)

# Pillow's fixed-point precision for 8-bit resampling (Resample.c: 32 - 8 - 2).
_PRECISION_BITS = 22


class ImageError(ValueError):
    """An image that cannot be decoded or is outside the limits; the message says why."""


# ---------------------------------------------------------------------------
# configuration


def _three_floats(value, name: str) -> tuple[float, float, float]:
    """Accept a scalar (open_clip allows one) or three numbers; anything else is a config bug."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,) * 3
    values = tuple(float(v) for v in value)
    if len(values) != 3:
        raise ValueError(f'{name} needs 3 values (one per RGB channel), got {value!r}')
    return values  # type: ignore[return-value]


@dataclass(frozen=True)
class PreprocessConfig:
    """What a model expects of its input images, plus the limits we accept from clients."""

    image_size: int = 224
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD
    interpolation: str = 'bicubic'
    resize_mode: str = 'shortest'
    max_pixels: int = 50_000_000
    max_aspect_ratio: float = 200.0
    jpeg_draft: bool = False  # decode JPEGs at a reduced scale: faster, not bit-exact (opt-in)

    def __post_init__(self):
        """Fail at load time on a bad config rather than on the first request."""
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 1:
            raise ValueError(f'image_size must be a positive int, got {self.image_size!r}')
        object.__setattr__(self, 'mean', _three_floats(self.mean, 'mean'))
        object.__setattr__(self, 'std', _three_floats(self.std, 'std'))
        if any(not math.isfinite(v) for v in self.mean + self.std) or min(self.std) <= 0:
            raise ValueError(f'mean must be finite and std finite and positive, got {self.mean}, {self.std}')
        if self.interpolation not in _RESAMPLE:
            raise ValueError(f'interpolation must be one of {sorted(_RESAMPLE)}, got {self.interpolation!r}')
        if self.resize_mode not in ('shortest', 'squash'):
            raise ValueError(f"resize_mode must be 'shortest' or 'squash', got {self.resize_mode!r}")
        if self.max_pixels < 1:
            raise ValueError(f'max_pixels must be positive, got {self.max_pixels!r}')
        if not self.max_aspect_ratio >= 1:
            raise ValueError(f'max_aspect_ratio must be at least 1, got {self.max_aspect_ratio!r}')

    @classmethod
    def from_open_clip(cls, cfg: dict) -> 'PreprocessConfig':
        """Build from open_clip's ``preprocess_cfg`` so model configs stay the single source of truth."""
        size = cfg.get('size', 224)
        if isinstance(size, (tuple, list)):
            if len(size) != 2 or size[0] != size[1]:
                raise ValueError(f'only square image sizes are supported, got {size!r}')
            size = size[0]
        interpolation = cfg.get('interpolation') or 'bicubic'
        if interpolation == 'random':  # open_clip's eval transform treats 'random' as bicubic
            interpolation = 'bicubic'
        return cls(
            image_size=int(size),
            mean=cfg.get('mean') or OPENAI_MEAN,
            std=cfg.get('std') or OPENAI_STD,
            interpolation=interpolation,
            resize_mode=cfg.get('resize_mode') or 'shortest',
        )


# ---------------------------------------------------------------------------
# decoding and limits


def _check_limits(width: int, height: int, config: PreprocessConfig) -> None:
    """Refuse sizes that would cost too much memory or squeeze the content to nothing."""
    if width < 1 or height < 1:
        raise ImageError(f'image has no pixels ({width}x{height})')
    if width * height > config.max_pixels:
        raise ImageError(
            f'image is {width}x{height} = {width * height} pixels, over the limit of {config.max_pixels} pixels'
        )
    ratio = max(width, height) / min(width, height)
    if ratio > config.max_aspect_ratio:
        raise ImageError(
            f'image is {width}x{height}, aspect ratio {ratio:.1f} is over the limit of {config.max_aspect_ratio:g}'
        )


def open_image(data: bytes, config: PreprocessConfig) -> Image.Image:
    """Decode client bytes, checking the declared size before any pixel is decoded.

    Image.open only parses the header, so the limits are checked before ``load()``
    allocates anything.  Animated images give their first frame (what Image.open
    shows, and what open_clip would see).  The EXIF orientation is applied, since
    that is how the picture is meant to be seen; open_clip does not do this.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f'image data must be bytes, got {type(data).__name__}')
    if len(data) == 0:
        raise ImageError('empty image data')
    try:
        image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f'image too large: {exc}') from None
    except UnidentifiedImageError:
        raise ImageError('not an image Pillow can decode') from None
    except MemoryError:
        raise
    except Exception as exc:  # Pillow plugins raise many types on bad headers
        raise ImageError(f'unreadable image header: {exc}') from None
    _check_limits(image.width, image.height, config)
    if config.jpeg_draft and image.format == 'JPEG':
        _draft(image, config)
    try:
        image.load()  # decode now, so truncated data fails here and not mid-batch
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f'image too large: {exc}') from None
    except MemoryError:
        raise
    except Exception as exc:
        raise ImageError(f'truncated or corrupt image data: {exc}') from None
    try:
        ImageOps.exif_transpose(image, in_place=True)
    except Exception:  # unreadable EXIF: the pixels are fine, keep them as stored
        pass
    return image


def _draft(image: Image.Image, config: PreprocessConfig) -> None:
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale, as small as still covers the resize target.

    The DCT-domain downscale replaces part of the bicubic resize, so pixels differ slightly from
    open_clip's (benchmarks/jpeg_draft.py measures by how much); decoding a photo costs 2-10x less.
    """
    if config.resize_mode == 'squash':
        target = (config.image_size, config.image_size)
    else:
        target = _shortest_side_size(image.width, image.height, config.image_size)
    try:
        image.draft(image.mode, target)
    except (OSError, ValueError):  # an unusual JPEG the draft path refuses: decode it in full
        pass


def _array_to_uint8(array: np.ndarray) -> np.ndarray:
    """Bring any real-valued pixel array to uint8: floats in [0, 1] are scaled, the rest clipped."""
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind == 'f':
        if not np.isfinite(array).all():
            raise ImageError('image tensor contains NaN or infinite values')
        unit_range = float(array.min()) >= 0.0 and float(array.max()) <= 1.0
        work = array.astype(np.float64 if array.dtype == np.float64 else np.float32)  # one working copy
        if unit_range:
            work *= 255.0
        np.clip(work, 0.0, 255.0, out=work)
        np.rint(work, out=work)
        return work.astype(np.uint8)
    return np.clip(array, 0, 255).astype(np.uint8)


def image_from_array(array: np.ndarray, config: PreprocessConfig) -> Image.Image:
    """Turn a docarray v1 image tensor (HWC or HW) into the image its PNG blob would decode to.

    docarray's ``convert_image_tensor_to_blob`` saves 2-D and single-channel tensors
    as 'L' and 3/4-channel ones as 'RGB' (alpha dropped, not composited), so we do
    the same and a uint8 tensor gives exactly the pixels of its blob.  Where
    docarray is lossy we are not: floats are rounded (it truncates, and wraps
    values outside 0..255), and a height or width of 1 stays as given (it
    squeezes the axis away, garbling the image).
    """
    try:
        array = np.asarray(array)
    except Exception as exc:
        raise ImageError(f'image tensor is not an array: {exc}') from None
    if array.dtype.kind not in 'uif':
        raise ImageError(f'image tensor dtype {array.dtype} is not a real number type')
    if array.ndim not in (2, 3):
        raise ImageError(f'image tensor shape {array.shape} is not HxW or HxWxC')
    if array.ndim == 3 and array.shape[2] not in (1, 3, 4):
        raise ImageError(
            f'image tensor shape {array.shape} has {array.shape[2]} channels, expected C in 1, 3, 4 (HxWxC)'
        )
    if 0 in array.shape:
        raise ImageError(f'image tensor shape {array.shape} is empty')
    height, width = array.shape[:2]
    _check_limits(width, height, config)
    if array.ndim == 3:
        array = array[:, :, 0] if array.shape[2] == 1 else array[:, :, :3]
    pixels = np.ascontiguousarray(_array_to_uint8(array))
    return Image.fromarray(pixels)


# ---------------------------------------------------------------------------
# geometry: torchvision's Resize(int) and CenterCrop rules


def _shortest_side_size(width: int, height: int, size: int) -> tuple[int, int]:
    """Resize(size) target: shorter side -> size, longer side truncated like torchvision does."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def _center_crop_box(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """CenterCrop(size) window; Python's round (half to even) is what torchvision uses."""
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return left, top, left + size, top + size


# ---------------------------------------------------------------------------
# exact windowed resize (memory guard)


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


def _vertical_first_pillow13(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Newer Pillow (13 here, PR #9549) does the vertical pass first if height shrinks over twice as much."""
    return new_height < height and height - new_height > 2 * (width - new_width)


def _vertical_first_never(width: int, height: int, new_width: int, new_height: int) -> bool:
    """Older Pillow always runs the horizontal pass first."""
    return False


_PASS_ORDER_RULES = (_vertical_first_pillow13, _vertical_first_never)


def _resize_crop_exact(
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
    mode = _PREMULTIPLIED.get(image.mode, image.mode)
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
def _calibrated_pass_order() -> Optional[Callable[[int, int, int, int], bool]]:
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
                np.asarray(probe.resize(size, _RESAMPLE[interpolation])),
                np.asarray(_resize_crop_exact(probe, size, (0, 0) + size, interpolation, rule)),
            )
            for size in sizes
            for interpolation in _RESAMPLE
        ):
            return rule
    return None


# ---------------------------------------------------------------------------
# the transform


def _plain_resize_pixels(width: int, height: int, new_width: int, new_height: int) -> int:
    """Roughly what Pillow allocates for a whole-image resize: first pass output plus result, in pixels."""
    if _vertical_first_pillow13(width, height, new_width, new_height):
        first_pass = width * new_height
    else:
        first_pass = new_width * height
    return first_pass + new_width * new_height


def _resize_shortest_and_crop(image: Image.Image, config: PreprocessConfig) -> Image.Image:
    """Resize(S) then CenterCrop(S), in the image's own mode as torchvision does it."""
    size = config.image_size
    new_size = _shortest_side_size(image.width, image.height, size)
    crop = _center_crop_box(new_size[0], new_size[1], size)
    if new_size == image.size:  # torchvision skips the resize when nothing changes
        return image.crop(crop)
    if _plain_resize_pixels(*image.size, *new_size) > _PLAIN_RESIZE_MAX_PIXELS and image.mode in _EXACT_MODES:
        rule = _calibrated_pass_order()
        if rule is not None:
            return _resize_crop_exact(image, new_size, crop, config.interpolation, rule)
    resized = image.resize(new_size, _RESAMPLE[config.interpolation])
    cropped = resized.crop(crop)
    del resized  # the full resized strip can be large; drop it before converting
    return cropped


def _resize_squash(image: Image.Image, config: PreprocessConfig) -> Image.Image:
    """Resize((S, S)), ignoring the aspect ratio, as open_clip's 'squash' mode does."""
    size = config.image_size
    if image.size == (size, size):
        return image
    return image.resize((size, size), _RESAMPLE[config.interpolation])


def _to_normalized_chw(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """ToTensor + Normalize, in float32 with torch's operation order: x / 255, - mean, / std."""
    pixels = np.asarray(image, dtype=np.uint8)
    chw = pixels.transpose(2, 0, 1).astype(np.float32, order='C')
    chw /= np.float32(255.0)
    chw -= np.asarray(config.mean, dtype=np.float32)[:, None, None]
    chw /= np.asarray(config.std, dtype=np.float32)[:, None, None]
    return chw


def preprocess_image(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """open_clip's eval transform on a PIL image, as a float32 array of shape [3, S, S]."""
    _check_limits(image.width, image.height, config)
    try:
        if config.resize_mode == 'squash':
            window = _resize_squash(image, config)
        else:
            window = _resize_shortest_and_crop(image, config)
        rgb = window.convert('RGB')
    except MemoryError:
        raise
    except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot resample or turn into RGB
        raise ImageError(f'cannot preprocess a {image.mode} image: {exc}') from None
    del window
    return _to_normalized_chw(rgb, config)


def preprocess_bytes(data: bytes, config: PreprocessConfig) -> np.ndarray:
    """Decode and preprocess client bytes in one step (the common serving path)."""
    image = open_image(data, config)
    try:
        return preprocess_image(image, config)
    finally:
        image.close()
