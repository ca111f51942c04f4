"""Qwen2-VL's images (ColQwen2) as one fixed-shape array per image, so the pipeline can stack any sizes in a batch.

transformers' Qwen2-VL image processor resizes each image, keeping its aspect ratio, to sides that are
multiples of `patch_size * merge_size` with a pixel count within [min_pixels, max_pixels] (`smart_resize`),
normalises it and cuts it into patches, listed window by window (each `merge_size` x `merge_size` window of
patches together, windows in row-major order: the order the model merges them in). Each patch is repeated
`temporal_patch_size` times (an image is a video of one frame), and the model takes the patches with each
image's grid (1, rows, columns). clipserve carries one image as float32 `[max_patches, 3 * patch_size**2 + 3]`
(THE layout):

- columns `[:-3]`: the patch's pixels, (channel, row, column) within the patch, as transformers orders
  them, without the temporal repeat (the model wrapper repeats it: half the bytes); zeros on padding rows;
- column `-3`: 1 on the image's patches, 0 on padding;
- column `-2`: 1 on the first `rows` rows (its sum is the number of patch rows);
- column `-1`: 1 on the first `columns` rows (its sum is the number of patch columns).

Counting ones keeps the grid exact in any precision the batch is cast to (as naflex.py does). The model
wrapper (families/late_interaction.py) reads it back. `max_patches` bounds the patches of any image; an image
whose resize would need more (possible only if min_pixels is close to max_pixels) is refused by name. Only the
standard library and NumPy are imported here, on purpose.
"""

from __future__ import annotations

import math

import numpy as np

EXTRA_COLUMNS = 3  # mask, row-count and column-count columns after the patch pixels
MAX_ASPECT_RATIO = 200  # smart_resize's own limit


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) the image is resized to, as transformers' `smart_resize` computes it: sides rounded to
    multiples of `factor`, scaled down to at most `max_pixels` or up to at least `min_pixels`."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f'absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {max(height, width) / min(height, width)}'
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def max_patches(patch_size: int, merge_size: int, max_pixels: int) -> int:
    """The layout's rows: the most patches `smart_resize` gives an image. That is `max_pixels`' worth, except
    where it keeps at least one `factor` on a side that scaling would shrink below it (an extreme aspect
    ratio under a small budget): the long side then reaches sqrt(MAX_ASPECT_RATIO * max_pixels)."""
    factor = patch_size * merge_size
    clamped = factor * (math.isqrt(MAX_ASPECT_RATIO * max_pixels) // factor * factor)
    return max(1, max(max_pixels, clamped) // (patch_size * patch_size))


def patchify(chw: np.ndarray, patch_size: int, merge_size: int, rows_out: int) -> np.ndarray:
    """A normalised [3, H, W] image (sides multiples of patch_size * merge_size) as the layout above."""
    channels, height, width = chw.shape
    rows, columns = height // patch_size, width // patch_size
    count = rows * columns
    if count > rows_out:
        raise ValueError(
            f'the image resizes to {rows}x{columns} = {count} patches, more than the {rows_out} this model takes '
            f'(its max_pixels): its aspect ratio is too extreme'
        )
    m = merge_size
    patches = chw.reshape(channels, rows // m, m, patch_size, columns // m, m, patch_size)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # windows, patch in window, channel, pixel row, pixel column
    out = np.zeros((rows_out, channels * patch_size * patch_size + EXTRA_COLUMNS), dtype=np.float32)
    out[:count, :-EXTRA_COLUMNS] = patches.reshape(count, -1)
    out[:count, -3] = 1
    out[:rows, -2] = 1
    out[:columns, -1] = 1
    return out


def layout_width(patch_size: int) -> int:
    """The layout's number of columns for a patch size."""
    return 3 * patch_size * patch_size + EXTRA_COLUMNS
