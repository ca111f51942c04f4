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
elongated images (see ``resize_crop_exact``): there we compute only the kept
window with a NumPy transcription of Pillow's fixed-point resampler, which gives
the same bytes as Pillow's full resize followed by the crop.  It is checked
against the installed Pillow once per process and switched off if they disagree.

Decoding is defensive, because image bytes come from clients: declared sizes are
checked before pixels are decoded, and every decode failure becomes ``ImageError``.

Only the standard library, NumPy, Pillow and resample.py are imported here, on purpose.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from clipserve.models import qwen2_patches
from clipserve.models.naflex import naflex_size, patchify
from clipserve.models.resample import (
    EXACT_MODES,
    RESAMPLE,
    calibrated_pass_order,
    resize_crop_exact,
    vertical_first_pillow13,
)

__all__ = ['OPENAI_MEAN', 'OPENAI_STD', 'PreprocessConfig', 'ImageError']
__all__ += ['open_image', 'image_from_array', 'preprocess_image', 'preprocess_bytes']

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

# Above this many pixels, Pillow's plain resize of the whole image (its first-pass
# intermediate plus the output) is mostly thrown away by the crop, so we compute
# only the kept window instead.  4M pixels is ~16 MB at Pillow's 4 bytes/pixel.
_PLAIN_RESIZE_MAX_PIXELS = 4_000_000


class ImageError(ValueError):
    """An image that cannot be decoded or is outside the limits; the message says why."""


# ---------------------------------------------------------------------------
# configuration


CROP_RULES = ('round', 'floor')
RESIZE_MODES = ('shortest', 'squash', 'naflex', 'qwen2')
PATCH_MODES = ('naflex', 'qwen2')  # one fixed-shape array of patches per image (naflex.py, qwen2_patches.py)


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
    # the center crop's offset: 'round' ((size - S) / 2 rounded, torchvision's and so open_clip's) or
    # 'floor' (transformers' image processors); they differ by a pixel when the margin is odd
    crop: str = 'round'
    max_pixels: int = 50_000_000
    max_aspect_ratio: float = 200.0
    jpeg_draft: bool = False  # decode JPEGs at a reduced scale: faster, not bit-exact (opt-in)
    # resize_mode 'naflex' (SigLIP2): aspect kept, at most max_num_patches patches of patch_size pixels,
    # output laid out as naflex.py says; image_size is then only the nominal size (warm-up, listings)
    patch_size: int | None = None
    max_num_patches: int | None = None
    # resize_mode 'qwen2' (ColQwen2): smart_resize to multiples of patch_size * merge_size with a pixel count in
    # pixel_range (min, max); max_num_patches is the layout's rows (qwen2_patches.py)
    merge_size: int | None = None
    pixel_range: tuple[int, int] | None = None

    def __post_init__(self):
        """Fail at load time on a bad config rather than on the first request."""
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 1:
            raise ValueError(f'image_size must be a positive int, got {self.image_size!r}')
        object.__setattr__(self, 'mean', _three_floats(self.mean, 'mean'))
        object.__setattr__(self, 'std', _three_floats(self.std, 'std'))
        if any(not math.isfinite(v) for v in self.mean + self.std) or min(self.std) <= 0:
            raise ValueError(f'mean must be finite and std finite and positive, got {self.mean}, {self.std}')
        if self.interpolation not in RESAMPLE:
            raise ValueError(f'interpolation must be one of {sorted(RESAMPLE)}, got {self.interpolation!r}')
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f'resize_mode must be one of {", ".join(RESIZE_MODES)}, got {self.resize_mode!r}')
        naflex = (self.patch_size, self.max_num_patches)
        if (self.resize_mode in PATCH_MODES) != all(isinstance(v, int) and not isinstance(v, bool) for v in naflex):
            raise ValueError(f"resize_mode 'naflex' and only it needs patch_size and max_num_patches, got {naflex}")
        if self.resize_mode in PATCH_MODES and min(naflex) < 1:
            raise ValueError(f'patch_size and max_num_patches must be positive, got {naflex}')
        qwen2 = (self.merge_size, *(self.pixel_range or (None, None)))
        if (self.resize_mode == 'qwen2') != all(isinstance(v, int) and v >= 1 for v in qwen2):
            raise ValueError(f"resize_mode 'qwen2' and only it needs merge_size and pixel_range, got {qwen2}")
        if self.crop not in CROP_RULES:
            raise ValueError(f'crop must be one of {", ".join(CROP_RULES)}, got {self.crop!r}')
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
    elif config.resize_mode in PATCH_MODES:
        target = _patches_size(image.width, image.height, config)
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


def _center_crop_box(width: int, height: int, size: int, rule: str = 'round') -> tuple[int, int, int, int]:
    """CenterCrop(size) window; Python's round (half to even) is what torchvision uses, floor transformers'."""
    if rule == 'floor':
        top, left = (height - size) // 2, (width - size) // 2
    else:
        top, left = int(round((height - size) / 2.0)), int(round((width - size) / 2.0))
    return left, top, left + size, top + size


# ---------------------------------------------------------------------------
# the transform


def _plain_resize_pixels(width: int, height: int, new_width: int, new_height: int) -> int:
    """Roughly what Pillow allocates for a whole-image resize: first pass output plus result, in pixels."""
    if vertical_first_pillow13(width, height, new_width, new_height):
        first_pass = width * new_height
    else:
        first_pass = new_width * height
    return first_pass + new_width * new_height


def _resize_shortest_and_crop(image: Image.Image, config: PreprocessConfig) -> Image.Image:
    """Resize(S) then CenterCrop(S), in the image's own mode as torchvision does it."""
    size = config.image_size
    new_size = _shortest_side_size(image.width, image.height, size)
    crop = _center_crop_box(new_size[0], new_size[1], size, config.crop)
    if new_size == image.size:  # torchvision skips the resize when nothing changes
        return image.crop(crop)
    if _plain_resize_pixels(*image.size, *new_size) > _PLAIN_RESIZE_MAX_PIXELS and image.mode in EXACT_MODES:
        rule = calibrated_pass_order()
        if rule is not None:
            return resize_crop_exact(image, new_size, crop, config.interpolation, rule)
    resized = image.resize(new_size, RESAMPLE[config.interpolation])
    cropped = resized.crop(crop)
    del resized  # the full resized strip can be large; drop it before converting
    return cropped


def _resize_squash(image: Image.Image, config: PreprocessConfig) -> Image.Image:
    """Resize((S, S)), ignoring the aspect ratio, as open_clip's 'squash' mode does."""
    size = config.image_size
    if image.size == (size, size):
        return image
    return image.resize((size, size), RESAMPLE[config.interpolation])


def _patches_size(width: int, height: int, config: PreprocessConfig) -> tuple[int, int]:
    """(width, height) of SigLIP2's or Qwen2-VL's aspect-keeping resize."""
    if config.resize_mode == 'qwen2':
        factor = config.patch_size * config.merge_size
        try:
            new_height, new_width = qwen2_patches.smart_resize(height, width, factor, *config.pixel_range)
        except ValueError as exc:
            raise ImageError(str(exc)) from None
    else:
        new_height, new_width = naflex_size(height, width, config.patch_size, config.max_num_patches)
    return new_width, new_height


def _resize_patches(image: Image.Image, config: PreprocessConfig) -> Image.Image:
    """Resize((h, w)) to the size the patch mode picks, as transformers' PIL processors do (always resampled)."""
    return image.resize(_patches_size(image.width, image.height, config), RESAMPLE[config.interpolation])


def _to_normalized_chw(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """ToTensor + Normalize, in float32 with torch's operation order: x / 255, - mean, / std."""
    pixels = np.asarray(image, dtype=np.uint8)
    chw = pixels.transpose(2, 0, 1).astype(np.float32, order='C')
    chw /= np.float32(255.0)
    chw -= np.asarray(config.mean, dtype=np.float32)[:, None, None]
    chw /= np.asarray(config.std, dtype=np.float32)[:, None, None]
    return chw


def preprocess_image(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """open_clip's eval transform on a PIL image, as a float32 array of shape [3, S, S]
    (NaFlex: [max_num_patches, patch_size**2 * 3 + 3], laid out as naflex.py says)."""
    _check_limits(image.width, image.height, config)
    try:
        if config.resize_mode in PATCH_MODES:
            window = _resize_patches(image, config)
        elif config.resize_mode == 'squash':
            window = _resize_squash(image, config)
        else:
            window = _resize_shortest_and_crop(image, config)
        rgb = window.convert('RGB')
    except MemoryError:
        raise
    except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot resample or turn into RGB
        raise ImageError(f'cannot preprocess a {image.mode} image: {exc}') from None
    del window
    if config.resize_mode == 'qwen2':
        chw = _to_normalized_chw(rgb, config)
        try:
            return qwen2_patches.patchify(chw, config.patch_size, config.merge_size, config.max_num_patches)
        except ValueError as exc:
            raise ImageError(str(exc)) from None
    if config.resize_mode == 'naflex':
        return patchify(_to_normalized_chw(rgb, config), config.patch_size, config.max_num_patches)
    return _to_normalized_chw(rgb, config)


def preprocess_bytes(data: bytes, config: PreprocessConfig) -> np.ndarray:
    """Decode and preprocess client bytes in one step (the common serving path)."""
    image = open_image(data, config)
    try:
        return preprocess_image(image, config)
    finally:
        image.close()
