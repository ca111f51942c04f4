"""SigLIP2's NaFlex images as one fixed-shape array per image, so the pipeline can stack any sizes in a batch.

transformers' Siglip2 image processor resizes each image, keeping its aspect ratio, to the largest size
whose sides are multiples of `patch_size` with at most `max_num_patches` patches, normalises it, cuts
it into patches in row-major order and pads them to `max_num_patches`. The model takes three inputs:
the patches, the padding mask and each image's (rows, columns) of patches. clipserve carries all three
in one float32 array of shape `[max_num_patches, patch_size * patch_size * 3 + 3]` (THE layout):

- columns `[:-3]`: the patch's pixels, (row, column, channel) within the patch, as transformers orders
  them; zeros on the padding rows;
- column `-3`: 1 on the image's patches, 0 on padding (`pixel_attention_mask`);
- column `-2`: 1 on the first `rows` rows, so its sum is the number of patch rows;
- column `-1`: 1 on the first `columns` rows, so its sum is the number of patch columns.

Counting ones instead of writing the numbers keeps the shape exact in any precision a backend casts the
batch to (bf16 holds integers exactly only up to 256). `split_naflex` (torch, in families/transformers.py) and
the exported ONNX graph read it back. Only the standard library and NumPy are imported here, on purpose.
"""

from __future__ import annotations

import math

import numpy as np

EXTRA_COLUMNS = 3  # mask, row-count and column-count columns after the patch pixels


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """(height, width) the image is resized to: transformers' `get_image_size_for_max_num_patches`, verbatim
    (a binary search on the scale, each side rounded up to a multiple of the patch size, at least one patch)."""

    def scaled(scale: float, size: int) -> int:
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while (high - low) >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def patchify(chw: np.ndarray, patch_size: int, max_num_patches: int) -> np.ndarray:
    """A normalised [3, H, W] image (sides multiples of the patch size) as the layout above."""
    channels, height, width = chw.shape
    rows, columns = height // patch_size, width // patch_size
    count = rows * columns
    if count > max_num_patches:
        raise ValueError(f'{rows}x{columns} patches exceed max_num_patches {max_num_patches}')
    patches = chw.reshape(channels, rows, patch_size, columns, patch_size).transpose(1, 3, 2, 4, 0)
    out = np.zeros((max_num_patches, patch_size * patch_size * channels + EXTRA_COLUMNS), dtype=np.float32)
    out[:count, :-EXTRA_COLUMNS] = patches.reshape(count, -1)
    out[:count, -3] = 1
    out[:rows, -2] = 1
    out[:columns, -1] = 1
    return out


def naflex_width(patch_size: int) -> int:
    """The layout's number of columns for a patch size."""
    return patch_size * patch_size * 3 + EXTRA_COLUMNS
