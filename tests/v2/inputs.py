"""What the v2 tests send, and what the v1 Flow answered for it (tests/test_docarray_v2.py): no DocArray here,
so both environments import it.

The v1 reference is a v1 Flow (docarray 0.21) serving the same ONNX export: texts as Document(text=...),
images as Document(blob=PNG). The v2 Flows get the same texts, and the same images as every input kind:
a data: URI, bytes_, the decoded pixels as a tensor, and a file URL (PNG is lossless, so all four decode
to the blob's pixels).
"""

from __future__ import annotations

import base64
import io
import os

import numpy as np

TINY = 'clipserve-tiny::random'
EXPORT_ENV = 'CLIPSERVE_V2_EXPORT'  # the ONNX export of TINY that both Flows serve
REFERENCE_ENV = 'CLIPSERVE_V2_REFERENCE'  # an .npz of the v1 Flow's embeddings: texts, images
MIN_COSINE = 0.99999

TEXTS = ['a photo of a dog', 'a diagram of a cat on a mat', 'über naïve café', 'a red square, seen from above']


def png(seed: int, width: int = 64, height: int = 48) -> bytes:
    """A smooth gradient plus noise, so resampling has real work to do."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x * 3 + y) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format='PNG')
    return out.getvalue()


IMAGES = [png(0), png(1, 80, 60), png(2, 50, 90)]


def pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert('RGB'))


def data_uri(data: bytes, mime: str = 'image/png') -> str:
    return f'data:{mime};base64,' + base64.b64encode(data).decode()


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def reference() -> dict[str, np.ndarray]:
    with np.load(os.environ[REFERENCE_ENV]) as saved:
        return {name: saved[name] for name in saved.files}
