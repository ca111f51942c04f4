"""Turn one input of any accepted type into a Document holding only what the server needs to see.

Accepted: str (a text; an http(s) URL, data: URI or image file name is an image), bytes (an encoded
image), pathlib.Path (an image file), a numpy HxWxC array or PIL image (sent as PNG), and a docarray
Document (its text, blob, tensor or uri). The caller's own Documents are never modified here.
"""

from __future__ import annotations

import mimetypes
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from docarray import Document

from clipserve_client.fetch import fetch_url, read_data_uri, read_file
from clipserve_client.images import array_to_png, pil_to_png

ACCEPTED = 'str, bytes, pathlib.Path, numpy array (HxWxC image), PIL.Image.Image or docarray Document'


@dataclass(frozen=True)
class Loader:
    """How the client reads images it is given by reference."""

    fetch_timeout: float = 10.0
    max_bytes: int = 20 * 2**20

    def image_reference(self, text: str) -> bytes | None:
        """The image bytes `text` points to, or None when `text` is a plain text."""
        if text.startswith('data:'):
            return read_data_uri(text, max_bytes=self.max_bytes)
        if is_url(text):
            return fetch_url(text, timeout=self.fetch_timeout, max_bytes=self.max_bytes)
        if _looks_like_image_file(text):
            return read_file(text)
        return None


def is_url(text: str) -> bool:
    return text.startswith(('http://', 'https://')) and not any(c.isspace() for c in text)


def _looks_like_image_file(text: str) -> bool:
    mime = mimetypes.guess_type(text)[0]
    return bool(mime and mime.startswith('image/')) and '\n' not in text


def is_pil_image(value) -> bool:
    image_module = sys.modules.get('PIL.Image')  # not imported means it cannot be a PIL image
    return image_module is not None and isinstance(value, image_module.Image)


def to_content_document(value, loader: Loader, position: int) -> Document:
    """A new Document with the text, blob or tensor (and uri, if any) that `value` stands for."""
    try:
        return _convert(value, loader)
    except (TypeError, ValueError, OSError) as err:
        err.args = (f'input {position}: {err}',)  # same exception, now saying which input
        raise


def _convert(value, loader: Loader) -> Document:
    if isinstance(value, Document):
        return _from_document(value, loader)
    if isinstance(value, str):
        if not value:
            raise ValueError('an empty string is neither a text nor an image')
        blob = loader.image_reference(value)
        return Document(text=value) if blob is None else Document(blob=blob, uri=value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not value:
            raise ValueError('empty bytes are not an image')
        return Document(blob=bytes(value))
    if isinstance(value, Path):
        return Document(blob=read_file(value), uri=str(value))
    if isinstance(value, np.ndarray):
        return Document(blob=array_to_png(value))
    if is_pil_image(value):
        return Document(blob=pil_to_png(value))
    kind = (
        type(value).__qualname__
        if type(value).__module__ == 'builtins'
        else f'{type(value).__module__}.{type(value).__qualname__}'
    )
    raise TypeError(f'cannot send a {kind}; expected {ACCEPTED}')


def _from_document(doc: Document, loader: Loader) -> Document:
    # the server's order: a text wins; an image is the tensor, else the blob, else the uri
    if doc.text:
        return Document(text=doc.text)
    if doc.tensor is not None:
        return Document(tensor=doc.tensor)
    if doc.blob:
        return Document(blob=doc.blob, uri=doc.uri or None)
    if doc.uri:
        blob = loader.image_reference(doc.uri)
        if blob is None:  # a uri that names no image: read it as a file, as clip-client did
            blob = read_file(doc.uri)
        return Document(blob=blob, uri=doc.uri)
    raise TypeError(f'Document {doc.id!r} has no text, blob, tensor or uri to send')


def needs_fetch(value) -> bool:
    """Whether preparing `value` downloads something (worth doing in parallel)."""
    if isinstance(value, str):
        return is_url(value)
    if isinstance(value, Document):
        return not (value.text or value.blob or value.tensor is not None) and is_url(value.uri or '')
    return False
