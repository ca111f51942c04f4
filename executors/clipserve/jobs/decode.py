"""Turning rows into what the model (or a server) takes: read each image's bytes, decode and preprocess
them, one chunk of rows at a time, in a worker process or a Ray task.

This is the CPU-heavy half of bulk embedding, so it runs apart from the model, in parallel: the local
engine sends chunks to a pool of processes, the Ray engine maps it over batches. It imports no torch. Every
failure is kept per row (a corrupt file, a refused or unreachable URL, a file over the size limit), with
the server's own messages, so one bad row never costs its neighbours. Remote URLs are fetched a few at a
time in threads, since a fetch mostly waits on the network.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from clipserve.jobs.bridge import PreprocessConfig, UriPolicy, decode_image, validate_image
from clipserve.jobs.readers import Row

PIXELS, BYTES, NONE = 'pixels', 'bytes', 'none'  # what a chunk becomes: model input, checked bytes, nothing


@dataclass(frozen=True)
class DecodeSettings:
    preprocess: PreprocessConfig
    policy: UriPolicy
    mode: str = PIXELS
    fetch_threads: int = 8


@dataclass
class Decoded:
    """Per row: its error or None, width and height; then the images of the rows without error, in order
    (`pixels` stacked for the model, or `images`, the checked bytes, for a server)."""

    errors: list[str | None]
    widths: list[int | None]
    heights: list[int | None]
    pixels: np.ndarray | None = None
    images: list[bytes] | None = None

    @property
    def ok(self) -> list[int]:
        return [i for i, error in enumerate(self.errors) if error is None]


def ignore_sigint() -> None:
    """Pool initializer: Ctrl-C is the parent's to handle (it stops the pool), not each worker's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_fetch_pool: ThreadPoolExecutor | None = None


def _fetcher(threads: int) -> ThreadPoolExecutor:
    global _fetch_pool
    if _fetch_pool is None:
        _fetch_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix='clipserve-fetch')
    return _fetch_pool


def _is_remote(uri: str | None) -> bool:
    return bool(uri) and uri[:8].lower().startswith(('http://', 'https://'))


def _load(row: Row, policy: UriPolicy) -> bytes | str:
    """The row's image bytes, or the reason there are none (a str)."""
    if row.data is not None:
        if len(row.data) > policy.max_bytes:
            return f'the image is {len(row.data)} bytes, over the limit of {policy.max_bytes} bytes (--max-image-bytes)'
        return row.data
    if not row.uri:
        return 'the row has no image'
    try:
        return policy.load(row.uri)
    except ValueError as e:  # UriError
        return str(e) or type(e).__name__
    except Exception as e:  # never let one row's surprise sink the chunk
        return f'{type(e).__name__}: {e}'


def decode_rows(rows: list[Row], settings: DecodeSettings) -> Decoded:
    """Read, check and (mode pixels) preprocess every row that needs an image; failures stay per row."""
    n = len(rows)
    errors: list[str | None] = [row.error for row in rows]
    widths: list[int | None] = [None] * n
    heights: list[int | None] = [None] * n
    if settings.mode == NONE:
        return Decoded(errors, widths, heights)
    todo = [i for i in range(n) if errors[i] is None]
    remote = [i for i in todo if rows[i].data is None and _is_remote(rows[i].uri)]
    loaded: dict[int, bytes | str] = {}
    if len(remote) > 1:
        pool = _fetcher(settings.fetch_threads)
        loaded = dict(zip(remote, pool.map(lambda i: _load(rows[i], settings.policy), remote)))
    pixels, images = [], []
    for i in todo:
        data = loaded[i] if i in loaded else _load(rows[i], settings.policy)
        if isinstance(data, str):
            errors[i] = data
            continue
        try:
            if settings.mode == PIXELS:
                array, widths[i], heights[i] = decode_image(data, settings.preprocess)
                pixels.append(array)
            else:
                widths[i], heights[i] = validate_image(data, settings.preprocess)
                images.append(data)
        except ValueError as e:  # ImageError: corrupt, truncated, over the pixel or aspect limits
            errors[i] = str(e) or type(e).__name__
        except Exception as e:  # a decoder bug on one hostile file
            errors[i] = f'{type(e).__name__}: {e}'
    if settings.mode == PIXELS:
        stacked = np.stack(pixels) if pixels else None
        return Decoded(errors, widths, heights, pixels=stacked)
    return Decoded(errors, widths, heights, images=images)
