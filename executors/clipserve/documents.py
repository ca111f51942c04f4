"""DocArray-v1 glue: which documents are texts or images, and how to read an image document.

clip-as-service's rules, kept for compatibility: non-empty text wins over any image content; an
image is a tensor, else a blob, else a URI; a document with none of these is skipped silently.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from docarray import Document, DocumentArray

from clipserve.models.preprocess import (
    ImageError,
    PreprocessConfig,
    image_from_array,
    preprocess_bytes,
    preprocess_image,
)
from clipserve.uris import UriPolicy


def has_image(doc: Document) -> bool:
    return doc.tensor is not None or bool(doc.blob) or bool(doc.uri)


def split_texts_images(docs: DocumentArray) -> tuple[list[Document], list[Document]]:
    """(text docs, image docs); documents with no content are in neither."""
    texts, images = [], []
    for doc in docs:
        if doc.text:
            texts.append(doc)
        elif has_image(doc):
            images.append(doc)
    return texts, images


def image_loader(doc: Document, policy: UriPolicy, config: PreprocessConfig) -> Callable[[], np.ndarray]:
    """A zero-argument function that reads, decodes and preprocesses the image of `doc`.

    The content is captured now (in the request thread) so the worker thread never touches the
    Document, and the document itself is never mutated by loading.
    """
    tensor, blob, uri = doc.tensor, doc.blob, doc.uri
    if tensor is not None:  # capped by its shape: max_pixels, checked before any conversion
        return lambda: preprocess_image(image_from_array(np.asarray(tensor), config), config)
    if blob:
        return lambda: preprocess_bytes(_capped(blob, policy.max_bytes), config)
    return lambda: preprocess_bytes(policy.load(uri), config)


def _capped(blob: bytes, max_bytes: int) -> bytes:
    """The same cap on encoded bytes as data: URIs, files and downloads have (max_image_bytes)."""
    if len(blob) > max_bytes:
        raise ImageError(f'the image blob is {len(blob)} bytes, over the limit of {max_bytes} bytes (max_image_bytes)')
    return blob


def drop_image_content(doc: Document) -> None:
    """Remove the image payload (blob/tensor) to save bandwidth; the URI stays."""
    if doc.tensor is not None:
        doc.tensor = None
    if doc.blob:
        doc.blob = b''
