"""The whole TensorRT backend: on a stand-in for TensorRT and cuda-python everywhere (fakes.py), and on real
TensorRT where it can be imported (the tests marked `gpu`)."""

import importlib.util

import numpy as np
import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.tensorrt import backend as trb
from clipserve.backends.tensorrt.cache import sidecar_path
from clipserve.errors import BackendUnavailableError, EngineBuildError
from clipserve.models.tokenizer import Tokenizer

from ...compare import assert_close
from ...conftest import TINY
from .fakes import FakeCudart

HAVE_TENSORRT = importlib.util.find_spec('tensorrt') is not None
NO_TENSORRT = 'TensorRT is not installed here (it needs pypi.nvidia.com and an NVIDIA GPU)'
TEXTS = ['a photo of a dog', 'a much longer caption about a dog on a red chair in a garden', '!', '']


def _pixels(n, size=224):
    return np.random.default_rng(0).normal(size=(n, 3, size, size)).astype(np.float32)


def _cosine_distance(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((1 - (a * b).sum(axis=1)).max())


# ---- the whole backend on a stand-in for TensorRT ------------------------------------------------


def test_backend_on_fake_tensorrt_matches_torch(fake_trt, tiny_export, tiny_backend, cache):
    backend = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny_export), max_batch=4)
    assert backend.built == {'visual': 'no cached engine', 'textual': 'no cached engine'}
    assert backend.dtype == 'fp16' and backend.device == 'cuda:0' and backend.trims_padding
    assert backend.embed_dim == 64 and backend.image_size == 224 and backend.model_name == TINY
    assert [b['flags'] for b in fake_trt.builds] == [['FP16', 'TF32']] * 2
    pixels = _pixels(6)  # more than max_batch: runs in chunks of 4
    images = backend.encode_images(pixels)
    tokens = Tokenizer()(TEXTS * 2)
    texts = backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    assert images.dtype == texts.dtype == np.float32 and images.shape == (6, 64) and texts.shape == (8, 64)
    assert_close(images, tiny_backend.encode_images(pixels), rel=1e-5)
    assert_close(texts, tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask), rel=1e-5)
    assert backend.model_calls == 2 and 'batch 1..4' in backend.describe()
    for path in backend.engine_files.values():
        assert path.is_file() and sidecar_path(path).is_file()
    assert list((cache / 'tensorrt').glob('timing-NVIDIA-Fake-H200-sm9.0-trt10.99.0.cache'))
    backend.close()
    assert not fake_trt.cudart.buffers and fake_trt.cudart.streams == 0


def test_fake_tensorrt_cache_reuse_rebuild_and_keys(fake_trt, tiny_export, cache):
    first = create_backend('tensorrt', TINY, BackendOptions(dtype='fp32'), model_path=str(tiny_export), max_batch=4)
    assert fake_trt.builds[0]['flags'] == []  # fp32: no FP16, TF32 cleared
    again = create_backend('tensorrt', TINY, BackendOptions(dtype='fp32'), model_path=str(tiny_export), max_batch=4)
    assert again.built == {'visual': None, 'textual': None} and len(fake_trt.builds) == 2
    with open(first.engine_files['visual'], 'ab') as f:
        f.write(b'garbage')  # corrupt the visual engine only
    rebuilt = create_backend('tensorrt', TINY, BackendOptions(dtype='fp32'), model_path=str(tiny_export), max_batch=4)
    assert 'truncated' in rebuilt.built['visual'] and rebuilt.built['textual'] is None
    bigger = create_backend('tensorrt', TINY, BackendOptions(dtype='fp32'), model_path=str(tiny_export), max_batch=8)
    assert set(bigger.engine_files.values()).isdisjoint(first.engine_files.values())  # the profile is in the key
    for backend in (first, again, rebuilt, bigger):
        backend.close()


def test_fake_tensorrt_parse_failure_names_the_layer(fake_trt, tiny_export):
    fake_trt.parse_error = ('Unsupported operator FooBar', 12, '/visual/transformer/FooBar_3', 'FooBar')
    with pytest.raises(EngineBuildError) as info:
        create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny_export))
    message = str(info.value)
    assert 'parsing the visual engine' in message and 'node 12 (/visual/transformer/FooBar_3, FooBar)' in message
    assert 'ModelImporter: failed to import node' in message


def test_fake_tensorrt_without_gpu_fails_before_export(fake_trt, monkeypatch):
    monkeypatch.setattr(trb, 'import_cudart', lambda: FakeCudart(count=0))
    monkeypatch.setattr(trb, 'locate_export', lambda *a: pytest.fail('exported without a GPU'))
    with pytest.raises(BackendUnavailableError, match='no CUDA device is visible'):
        create_backend('tensorrt', TINY, BackendOptions())
    with pytest.raises(BackendUnavailableError, match='NVIDIA GPUs only'):
        create_backend('tensorrt', TINY, BackendOptions(device='cpu'))


# ---- real TensorRT (GPU machines only) --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_TENSORRT, reason=NO_TENSORRT)
@pytest.mark.parametrize('dtype,limit', [('fp16', 1e-2), ('fp32', 1e-4)])
def test_tensorrt_matches_torch(tiny_export, tiny_backend, cache, dtype, limit):
    backend = create_backend('tensorrt', TINY, BackendOptions(dtype=dtype), model_path=str(tiny_export), max_batch=8)
    tokens = Tokenizer()(TEXTS)
    pixels = _pixels(10)
    assert _cosine_distance(backend.encode_images(pixels), tiny_backend.encode_images(pixels)) < limit
    assert (
        _cosine_distance(
            backend.encode_texts(tokens.input_ids, tokens.attention_mask),
            tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask),
        )
        < limit
    )
    assert backend.trims_padding
    backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_TENSORRT, reason=NO_TENSORRT)
def test_tensorrt_engine_cache_and_rebuild(tiny_export, cache):
    first = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny_export), max_batch=4)
    assert all(first.built.values())
    again = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny_export), max_batch=4)
    assert again.built == {'visual': None, 'textual': None}
    first.engine_files['textual'].write_bytes(b'\0' * 100)
    rebuilt = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny_export), max_batch=4)
    assert rebuilt.built['textual'] and rebuilt.built['visual'] is None
    for backend in (first, again, rebuilt):
        backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_TENSORRT, reason=NO_TENSORRT)
def test_tensorrt_parse_error_is_reported(tmp_path, tiny_export, cache):
    import shutil

    for name in ('visual.onnx', 'textual.onnx', 'clipserve.json'):
        shutil.copy(tiny_export / name, tmp_path / name)
    (tmp_path / 'visual.onnx').write_bytes(b'not an onnx file')
    with pytest.raises(EngineBuildError, match='parsing the visual engine'):
        create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tmp_path))
