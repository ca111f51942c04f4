"""EncodePipeline: forward passes stay on one thread whichever request thread asks for them."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clipserve.pipeline import EncodePipeline


class RecordingBackend:
    """The real tiny backend, noting which thread ran each forward pass."""

    def __init__(self, backend):
        self._backend = backend
        self.threads = set()

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def encode_texts(self, *arrays):
        self.threads.add(threading.get_ident())
        return self._backend.encode_texts(*arrays)

    def encode_images(self, pixels):
        self.threads.add(threading.get_ident())
        return self._backend.encode_images(pixels)


@pytest.mark.parametrize('batch_wait', [None, 0.002])
def test_forward_passes_from_many_request_threads_run_on_one_model_thread(tiny_backend, batch_wait):
    backend = RecordingBackend(tiny_backend)
    pipeline = EncodePipeline(backend, minibatch_size=4, batch_wait=batch_wait)
    size = tiny_backend.preprocess.image_size
    pixels = np.random.default_rng(0).random((3, size, size), dtype=np.float32)
    try:

        def request(i):
            texts = pipeline.encode_texts([f'request {i} text {j}' for j in range(6)])
            images = pipeline.encode_images([lambda: pixels] * 3)
            return texts, images

        with ThreadPoolExecutor(6) as requests:
            results = list(requests.map(request, range(12)))
    finally:
        pipeline.close()
    assert len(backend.threads) == 1
    assert not backend.threads & {threading.get_ident()}
    expected = tiny_backend.encode_texts(pipeline.tokenizer(['request 5 text 2']).input_ids)
    np.testing.assert_allclose(results[5][0][2], expected[0], atol=1e-5)
    assert results[7][1].indices == [0, 1, 2] and not results[7][1].failures


def test_a_model_error_reaches_the_caller_and_the_pipeline_keeps_working(tiny_backend):
    pipeline = EncodePipeline(tiny_backend, minibatch_size=4)
    try:
        with pytest.raises(IndexError):  # token ids far outside the vocabulary
            pipeline._run_texts(np.full((2, 3), 10**7, dtype=np.int64), np.ones((2, 3), dtype=np.int64))
        assert pipeline.encode_texts(['still serving']).shape == (1, tiny_backend.embed_dim)
    finally:
        pipeline.close()
