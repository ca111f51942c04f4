"""Turn the caller's inputs into the items of an OpenAI-compatible request: `{"text": ...}` or `{"image": ...}`.

Items are always explicit objects, so a caption that starts with "http://" stays a text. Images travel as
base64 of the file's bytes (or a data: URI as given); URLs are downloaded here by default (a clipserve
server refuses to fetch them unless its operator allowed remote URIs), or passed on with fetch_urls=False.
"""

from __future__ import annotations

import base64
import mimetypes
import sys
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from clipserve_client.fetch import fetch_url, read_file
from clipserve_client.images import array_to_png, pil_to_png

ACCEPTED = (
    'str (a text; an http(s) URL, data: URI or image file name is an image), bytes (an image file), '
    'pathlib.Path, a numpy HxW or HxWxC array, a PIL image, {"text": ...} or {"image": ...}'
)
_FETCH_THREADS = 8


@dataclass(frozen=True)
class Loader:
    """How the client reads the images it is given by reference."""

    fetch_urls: bool = True  # False: send URLs to the server, which fetches them if its operator allows it
    fetch_timeout: float = 10.0
    max_bytes: int = 20 * 2**20

    def url_item(self, url: str) -> dict:
        if not self.fetch_urls:
            return {'image': url}
        return _image_bytes(fetch_url(url, timeout=self.fetch_timeout, max_bytes=self.max_bytes))


def is_url(text: str) -> bool:
    return text[:8].lower() == 'https://' or text[:7].lower() == 'http://'


def _looks_like_image_file(text: str) -> bool:
    mime = mimetypes.guess_type(text)[0]
    return bool(mime and mime.startswith('image/')) and '\n' not in text and not is_url(text)


def _is_pil_image(value) -> bool:
    module = sys.modules.get('PIL.Image')  # not imported means it cannot be a PIL image
    return module is not None and isinstance(value, module.Image)


def _image_bytes(data: bytes) -> dict:
    if not data:
        raise ValueError('empty image data')
    return {'image': base64.b64encode(data).decode('ascii')}


def to_item(value, where: str, loader: Loader) -> dict:
    """The request item for one input; errors start with `where` ('input 3', 'query', 'document 2')."""
    try:
        return _convert(value, loader)
    except (TypeError, ValueError, OSError) as err:
        err.args = (f'{where}: {err}',)  # the same exception, now naming the input
        raise


def _convert(value, loader: Loader) -> dict:
    if isinstance(value, Mapping):
        keys = [key for key in ('text', 'image') if key in value]
        if len(keys) != 1 or len(value) != 1:
            raise TypeError(f'an item mapping must have exactly one key, "text" or "image"; got {sorted(value)}')
        if keys[0] == 'text':
            text = value['text']
            if not isinstance(text, str) or not text.strip():
                raise ValueError('{"text": ...} needs a non-blank string')
            return {'text': text}
        return _image(value['image'], loader)
    if isinstance(value, str):
        if not value.strip():
            raise ValueError('an empty string is neither a text nor an image')
        if value[:5].lower() == 'data:' or is_url(value) or _looks_like_image_file(value):
            return _image(value, loader)
        return {'text': value}
    return _image(value, loader)


def _image(value, loader: Loader) -> dict:
    if isinstance(value, str):
        if value[:5].lower() == 'data:':
            return {'image': value}  # the server decodes and checks it
        if is_url(value):
            return loader.url_item(value)
        return _image_bytes(read_file(value, text_hint='{{"text": {}}}'))
    if isinstance(value, (bytes, bytearray, memoryview)):
        if not value:
            raise ValueError('empty bytes are not an image')
        return _image_bytes(bytes(value))
    if isinstance(value, Path):
        return _image_bytes(read_file(value, text_hint=None))
    if isinstance(value, np.ndarray):
        return _image_bytes(array_to_png(value))
    if _is_pil_image(value):
        return _image_bytes(pil_to_png(value))
    kind = type(value).__qualname__
    if type(value).__module__ != 'builtins':
        kind = f'{type(value).__module__}.{kind}'
    raise TypeError(f'cannot send a {kind}; expected {ACCEPTED}')


def check_many(inputs, name: str) -> None:
    """Refuse one input where a list belongs: `encode('a dog')` would otherwise send three letters' worth."""
    single = (str, bytes, bytearray, memoryview, Path, Mapping)
    if (
        isinstance(inputs, single)
        or (isinstance(inputs, np.ndarray) and inputs.ndim in (2, 3))
        or _is_pil_image(inputs)
    ):
        raise TypeError(
            f'{name}() takes a list of inputs, not a single {type(inputs).__name__}; try {name}([...]) with a list'
        )
    if not isinstance(inputs, Iterable):
        raise TypeError(f'{name}() takes a list (or any iterable) of inputs, got {type(inputs).__name__}')


def batches(inputs: Iterable, size: int) -> Iterator[tuple[int, list]]:
    """(offset of the first input, up to `size` inputs), lazily: a generator of inputs is read a batch at a time."""
    values, offset = iter(inputs), 0
    while chunk := list(islice(values, size)):
        yield offset, chunk
        offset += len(chunk)


def prepare(chunk: list, offset: int, loader: Loader) -> list[dict]:
    """The items of one batch; the batch's URLs are downloaded in parallel. The first bad input raises."""
    items = prepare_each(chunk, offset, loader)
    for item in items:
        if isinstance(item, Exception):
            raise item
    return items


def prepare_each(chunk: list, offset: int, loader: Loader) -> list[dict | Exception]:
    """Each input's item, or the error (naming the input) that it could not be read for."""

    def one(pair):
        try:
            return to_item(pair[1], f'input {offset + pair[0]}', loader)
        except (TypeError, ValueError, OSError) as err:
            return err

    fetching = sum(1 for value in chunk if isinstance(value, str) and is_url(value)) if loader.fetch_urls else 0
    if fetching > 1:
        with ThreadPoolExecutor(max_workers=min(fetching, _FETCH_THREADS)) as pool:
            return list(pool.map(one, enumerate(chunk)))
    return [one(pair) for pair in enumerate(chunk)]
