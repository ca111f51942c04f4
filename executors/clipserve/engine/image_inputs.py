"""The images a caller in this process hands Model.embed_images, as the engine's ImageSource: the decoders
the encoder uses for a document's blob, URI and tensor (models/preprocess.py, under the same URI policy and
limits), plus PIL images, which only an in-process caller can hand over."""

from __future__ import annotations

import os
from typing import Union

import numpy as np
from PIL import Image

from clipserve.engine.pipeline import ImageSource
from clipserve.errors import InvalidParameterError
from clipserve.inputs.uris import UriPolicy
from clipserve.models.preprocess import (
    ImageError,
    PreprocessConfig,
    image_from_array,
    preprocess_bytes,
    preprocess_image,
)

ImageInput = Union[str, os.PathLike, bytes, bytearray, memoryview, Image.Image, np.ndarray]


def image_source(image: ImageInput, index: int, policy: UriPolicy, config: PreprocessConfig) -> ImageSource:
    """How the pipeline gets the pixels of one image: a path or URL is fetched (in the fetch threads), the
    rest decoded from what is at hand. The value is captured now; the caller's object is never changed."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        return ImageSource(decode=lambda _: preprocess_bytes(capped(data, policy.max_bytes), config))
    if isinstance(image, os.PathLike):
        image = os.fspath(image)
    if isinstance(image, str):
        uri = image
        if uri.strip().startswith('data:'):
            return ImageSource(decode=lambda _: preprocess_bytes(policy.load(uri), config))
        return ImageSource(decode=lambda data: preprocess_bytes(data, config), fetch=lambda: policy.load(uri))
    if isinstance(image, np.ndarray):
        array = image
        return ImageSource(decode=lambda _: preprocess_image(image_from_array(array, config), config))
    if isinstance(image, Image.Image):
        picture = image
        return ImageSource(decode=lambda _: preprocess_image(picture, config))
    raise InvalidParameterError(
        f'images[{index}] is a {type(image).__name__}: give a file path, a data: or http(s) URI, bytes, a PIL image '
        'or an array [H, W, 3]'
    )


def capped(blob: bytes, max_bytes: int) -> bytes:
    """The same cap on encoded bytes as data: URIs, files and downloads have (max_image_bytes)."""
    if len(blob) > max_bytes:
        raise ImageError(f'the image blob is {len(blob)} bytes, over the limit of {max_bytes} bytes (max_image_bytes)')
    return blob
