"""Fuzz what a client controls: image bytes, HWC arrays, and documents (text/blob/uri) as the executor splits them.

    .venv/bin/python fuzz/fuzz_images.py -runs=20000            (atheris / libFuzzer options)

Any exception other than ImageError (the documented "bad image" answer) is a finding, as is a
result that is not float32 [3, S, S] and finite. The seed corpus is generated (fuzz/seeds.py).
"""

import sys

import atheris
import jina  # noqa: F401  (imported first, uninstrumented: the package imports it, and it is not under test)
import numpy as np
import PIL.Image  # noqa: F401  (Pillow's C decoders are what we feed; its Python side is not the target)
from docarray import Document, DocumentArray

with atheris.instrument_imports(include=['clipserve']):
    from clipserve.inputs.uris import UriError, UriPolicy
    from clipserve.models.preprocess import (
        ImageError,
        PreprocessConfig,
        image_from_array,
        preprocess_bytes,
        preprocess_image,
    )
    from clipserve.serving.replica.documents import image_loader, split_texts_images

POLICY = UriPolicy()  # data: URIs only, as a server runs by default

CONFIG = PreprocessConfig(image_size=32, max_pixels=4_000_000)


def check(pixels):
    assert pixels.shape == (3, 32, 32) and pixels.dtype == np.float32, (pixels.shape, pixels.dtype)
    assert np.isfinite(pixels).all()


def test_one(data: bytes) -> None:
    if not data:
        return
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 2)
    if mode == 2:
        fuzz_document(fdp)
    elif mode == 1:
        try:
            check(preprocess_bytes(fdp.ConsumeBytes(fdp.remaining_bytes()), CONFIG))
        except ImageError:
            pass
    else:
        dims = [fdp.ConsumeIntInRange(0, 40) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        dtype = fdp.PickValueInList([np.uint8, np.uint16, np.int32, np.float32, np.float64, np.bool_])
        raw = fdp.ConsumeBytes(fdp.remaining_bytes())
        count = int(np.prod(dims)) if dims else 1
        itemsize = np.dtype(dtype).itemsize
        buffer = (
            (raw * (count * itemsize // max(len(raw), 1) + 1))[: count * itemsize] if raw else b'\0' * count * itemsize
        )
        array = (
            np.frombuffer(buffer, dtype=dtype).reshape(dims) if dims else np.frombuffer(buffer[:itemsize], dtype=dtype)
        )
        try:
            check(preprocess_image(image_from_array(array, CONFIG), CONFIG))
        except ImageError:
            pass


def fuzz_document(fdp) -> None:
    """A document with fuzzed text/blob/uri goes through the executor's split and loading rules."""
    kind = fdp.ConsumeIntInRange(0, 2)
    payload = fdp.ConsumeBytes(fdp.remaining_bytes())
    if kind == 0:
        doc = Document(text=payload.decode('utf-8', 'replace'))
    elif kind == 1:
        doc = Document(blob=payload)
    else:
        doc = Document(uri='data:' + payload.decode('latin-1'))
    texts, images = split_texts_images(DocumentArray([doc]))
    assert len(texts) + len(images) <= 1
    for image in images:
        try:
            check(image_loader(image, POLICY, CONFIG)())
        except (ImageError, UriError):
            pass


if __name__ == '__main__':
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
