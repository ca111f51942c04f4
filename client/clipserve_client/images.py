"""In-memory images (numpy arrays, PIL images) as PNG bytes, what the server decodes.

PNG is lossless, so the server sees exactly these pixels. Arrays follow the server's rule for image
tensors, so an array and the same Document(tensor=array) give the same embedding: HxW or HxWxC with
C in 1, 3, 4 (alpha is dropped), uint8 as is, floats in [0, 1] scaled by 255, everything rounded and
clipped to 0..255. Arrays are written with zlib here (a PNG of 8-bit rows is a few lines), so the
light client needs no Pillow; PIL images use Pillow, which whoever passes one has.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_GRAY, _RGB = 0, 2  # PNG colour types


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


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))


def array_to_png(array: np.ndarray) -> bytes:
    shape = array.shape
    if array.ndim not in (2, 3) or (array.ndim == 3 and shape[2] not in (1, 3, 4)) or 0 in shape:
        raise ValueError(f'an image array must be HxW or HxWxC with C in 1, 3, 4 (HWC); got shape {shape}')
    if array.ndim == 3:
        array = array[:, :, 0] if shape[2] == 1 else array[:, :, :3]
    pixels = np.ascontiguousarray(_to_uint8(array))
    height, width = pixels.shape[:2]
    rows = pixels.reshape(height, -1)
    raw = np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()  # filter type 0 (none) per row
    header = struct.pack('>IIBBBBB', width, height, 8, _GRAY if pixels.ndim == 2 else _RGB, 0, 0, 0)
    # level 1: fast; the size hardly matters next to the request's base64
    return _SIGNATURE + _chunk(b'IHDR', header) + _chunk(b'IDAT', zlib.compress(raw, 1)) + _chunk(b'IEND', b'')


def pil_to_png(image) -> bytes:
    try:
        return _pil_png(image)
    except OSError:  # a mode PNG cannot store (CMYK, YCbCr, ...)
        return _pil_png(image.convert('RGB'))


def _pil_png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format='PNG', compress_level=1)
    return buffer.getvalue()
