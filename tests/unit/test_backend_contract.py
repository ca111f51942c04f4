"""backends/base.py: what every backend gets from the base class, once: padding or trimming of token
batches by the backend's declared rule, and chunking by its `max_batch` (and the CPU image chunk); then
the contract itself, kept by every real CPU backend on the same tiny model."""

import importlib.util
import os

import numpy as np
import pytest

from clipserve.backends.base import Backend
from clipserve.models.preprocess import PreprocessConfig

from ..compare import assert_close
from ..conftest import TINY


class RecordingBackend(Backend):
    """Records the arrays each forward pass receives; the 'embedding' is the row's token sum."""

    name = 'recording'
    model_name = 'recording'
    embed_dim = 1
    dtype = 'fp32'
    preprocess = PreprocessConfig(image_size=2)

    def __init__(self, *, trims_padding, context_length=8, pad_id=0, max_batch=None, device='cpu'):
        super().__init__()
        self.trims_padding, self.context_length, self.pad_id = trims_padding, context_length, pad_id
        self.max_batch, self.device = max_batch, device
        self.passes = []

    def _encode_images(self, pixels):
        self.passes.append(pixels.shape)
        return pixels.reshape(len(pixels), -1).sum(axis=1, keepdims=True)

    def _encode_texts(self, input_ids, attention_mask):
        self.passes.append((input_ids.copy(), attention_mask.copy()))
        return input_ids.sum(axis=1, keepdims=True).astype(np.float32)


IDS = np.array([[5, 6, 9, 0, 0], [5, 9, 0, 0, 0]])  # <eot> (9) is the largest id, as in CLIP's vocabulary


def test_a_causal_tower_runs_only_up_to_the_longest_text():
    backend = RecordingBackend(trims_padding=True)
    backend.encode_texts(IDS)
    ids, mask = backend.passes[0]
    assert ids.tolist() == [[5, 6, 9], [5, 9, 0]] and mask.tolist() == [[1, 1, 1], [1, 1, 0]]


@pytest.mark.parametrize('pad_id', [0, 1])
def test_a_fixed_length_tower_gets_exactly_its_context_padded_with_its_pad_id(pad_id):
    backend = RecordingBackend(trims_padding=False, context_length=8, pad_id=pad_id)
    mask = (IDS != 0).astype(np.int64)
    backend.encode_texts(IDS, mask)
    ids, got_mask = backend.passes[0]
    assert ids.shape == (2, 8) and ids[:, 5:].tolist() == [[pad_id] * 3] * 2
    assert got_mask.tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    backend.encode_texts(np.ones((1, 12), dtype=np.int64), np.ones((1, 12), dtype=np.int64))
    assert backend.passes[1][0].shape == (1, 8)  # never more than the tower takes


def test_batches_are_cut_to_max_batch_and_put_back_in_order():
    backend = RecordingBackend(trims_padding=True, max_batch=2, device='cuda:0')
    ids = np.array([[5, 9, 0], [6, 9, 0], [7, 9, 0], [8, 9, 0], [4, 9, 0]])
    out = backend.encode_texts(ids)
    assert [len(p[0]) for p in backend.passes] == [2, 2, 1]
    assert out[:, 0].tolist() == [14, 15, 16, 17, 13] and backend.model_calls == 1
    backend.passes.clear()
    pixels = np.arange(5 * 3 * 2 * 2, dtype=np.float32).reshape(5, 3, 2, 2)
    out = backend.encode_images(pixels)
    assert [p[0] for p in backend.passes] == [2, 2, 1]
    np.testing.assert_array_equal(out[:, 0], pixels.reshape(5, -1).sum(axis=1))


def test_on_a_cpu_images_run_in_cpu_chunks():
    backend = RecordingBackend(trims_padding=True)
    backend.encode_images(np.zeros((19, 3, 2, 2), dtype=np.float32))
    assert [p[0] for p in backend.passes] == [8, 8, 3]


# ---- the contract, on every real CPU backend --------------------------------------------------

# CI installs every CPU runtime (the test extra): there a missing one fails instead of skipping
RUNTIMES = {'torch': 'torch', 'onnx': 'onnxruntime', 'openvino': 'openvino'}


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    out = tmp_path_factory.mktemp('tiny-onnx')
    export_onnx(TINY, out)
    return out


@pytest.fixture(scope='module', params=list(RUNTIMES))
def real_backend(request, tiny_export):
    from clipserve.backends import BackendOptions, create_backend

    if importlib.util.find_spec(RUNTIMES[request.param]) is None and not os.environ.get('CI'):
        pytest.skip(f'{RUNTIMES[request.param]} is not installed')
    model_path = None if request.param == 'torch' else str(tiny_export)
    backend = create_backend(request.param, TINY, BackendOptions(device='cpu', dtype='fp32'), model_path=model_path)
    yield backend
    backend.close()


def test_every_backend_answers_float32_rows_of_its_dimension(real_backend):
    b = real_backend
    tokens = b.tokenizer(['a dog', 'a photo of a cat on a mat'])
    texts = b.encode_texts(tokens.input_ids, tokens.attention_mask)
    images = b.encode_images(np.zeros((3, 3, b.image_size, b.image_size), dtype=np.float32))
    for out, rows in ((texts, 2), (images, 3)):
        assert out.shape == (rows, b.embed_dim) and out.dtype == np.float32 and out.flags.c_contiguous
        assert np.isfinite(out).all()
    assert b.encode_texts(np.zeros((0, 77), dtype=np.int64)).shape == (0, b.embed_dim)
    assert b.encode_images(np.zeros((0, 3, b.image_size, b.image_size), dtype=np.float32)).shape == (0, b.embed_dim)
    assert (b.device, b.dtype, b.precision.name) == ('cpu', 'fp32', 'fp32') and b.name in b.describe()


def test_every_backend_encodes_a_row_the_same_alone_or_in_any_batch(real_backend):
    b = real_backend
    texts = ['a dog', 'a much longer caption about a dog on a red chair', '!']
    tokens = b.tokenizer(texts)
    together = b.encode_texts(tokens.input_ids, tokens.attention_mask)
    for i, text in enumerate(texts):  # alone, a short text runs at its own length where padding is trimmed
        alone = b.tokenizer([text])
        assert_close(b.encode_texts(alone.input_ids, alone.attention_mask)[0], together[i], rel=1e-5)
    pixels = np.random.default_rng(0).normal(size=(10, 3, b.image_size, b.image_size)).astype(np.float32)
    assert_close(b.encode_images(pixels)[9:], b.encode_images(pixels[9:]), rel=1e-5)  # 8 + 2


def test_every_backend_counts_its_forward_passes(real_backend):
    b = real_backend
    before = (b.model_calls, b.images_encoded, b.texts_encoded)
    b.encode_images(np.zeros((2, 3, b.image_size, b.image_size), dtype=np.float32))
    tokens = b.tokenizer(['a', 'b', 'c'])
    b.encode_texts(tokens.input_ids, tokens.attention_mask)
    assert (b.model_calls, b.images_encoded, b.texts_encoded) == (before[0] + 2, before[1] + 2, before[2] + 3)
