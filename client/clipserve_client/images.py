"""Encode in-memory images (numpy arrays, PIL images) as PNG, the blob the server decodes.

PNG is lossless, so the server sees exactly these pixels. Arrays follow the server's rule for image
tensors, so an array and the same Document(tensor=array) give the same embedding: HxW or HxWxC with
C in 1, 3, 4 (alpha is dropped), uint8 as is, floats in [0, 1] scaled by 255, everything rounded and
clipped to 0..255.
"""

from __future__ import annotations

import io

import numpy as np


def _to_uint8(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind == 'f':
        if not np.isfinite(array).all():
            raise ValueError('the image array contains NaN or infinite values')
        if array.min() >= 0 and array.max() <= 1:
            array = array * 255.0
        return np.rint(np.clip(array, 0, 255)).astype(np.uint8)
    if array.dtype.kind in 'iu':
        return np.clip(array, 0, 255).astype(np.uint8)
    raise TypeError(f'an image array must hold numbers, got dtype {array.dtype}')


def array_to_png(array: np.ndarray) -> bytes:
    shape = array.shape
    if array.ndim not in (2, 3) or (array.ndim == 3 and shape[2] not in (1, 3, 4)) or 0 in shape:
        raise ValueError(f'an image array must be HxW or HxWxC with C in 1, 3, 4 (HWC); got shape {shape}')
    if array.ndim == 3:
        array = array[:, :, 0] if shape[2] == 1 else array[:, :, :3]
    from PIL import Image

    return _png(Image.fromarray(np.ascontiguousarray(_to_uint8(array))))


def pil_to_png(image) -> bytes:
    try:
        return _png(image)
    except OSError:  # a mode PNG cannot store (CMYK, YCbCr, ...)
        return _png(image.convert('RGB'))


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format='PNG', compress_level=1)  # fast; the size hardly matters on a LAN
    return buffer.getvalue()
