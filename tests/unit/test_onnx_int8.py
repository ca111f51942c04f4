"""`dtype: int8` on the onnx backend: a dynamically quantized copy of the export, made once, cached with
an integrity record (the cache machinery is tests/unit/test_onnx_fp16.py's), close to fp32."""

import numpy as np
import onnx
import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.onnx_copies import INTEGRITY_FILE, MODEL_FILE
from clipserve.backends.onnx_export import export_onnx
from clipserve.errors import BackendUnavailableError

from ..conftest import TINY


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp('tiny-onnx')
    export_onnx(TINY, out)
    return out


def _cosine(a, b):
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_int8_is_a_cached_quantized_copy_close_to_fp32(exported, tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    fp32 = create_backend('onnx', None, BackendOptions(device='cpu'), model_path=str(exported))
    int8 = create_backend('onnx', None, BackendOptions(device='cpu', dtype='int8'), model_path=str(exported))
    assert (fp32.dtype, int8.dtype) == ('fp32', 'int8')
    copies = sorted((tmp_path / 'cache' / 'onnx-int8').glob('*/' + MODEL_FILE))
    assert [p.parent.name.split('-')[0] for p in copies] == ['textual', 'visual']
    for copy in copies:
        assert (copy.parent / INTEGRITY_FILE).is_file()
        ops = {node.op_type for node in onnx.load(str(copy), load_external_data=False).graph.node}
        assert 'MatMulInteger' in ops or 'DynamicQuantizeMatMul' in ops, ops
    tokens = fp32.tokenizer(['a photo of a cat', 'two dogs playing in the snow', 'a diagram'])
    pixels = np.random.default_rng(0).normal(size=(3, 3, 224, 224)).astype(np.float32)
    texts = _cosine(int8.encode_texts(tokens.input_ids, tokens.attention_mask), fp32.encode_texts(tokens.input_ids))
    images = _cosine(int8.encode_images(pixels), fp32.encode_images(pixels))
    print(f'\nint8 vs fp32 cosine: texts min {texts.min():.5f}, images min {images.min():.5f}')
    assert texts.min() > 0.99 and images.min() > 0.99
    again = create_backend('onnx', None, BackendOptions(device='cpu', dtype='int8'), model_path=str(exported))
    assert sorted((tmp_path / 'cache' / 'onnx-int8').glob('*/' + MODEL_FILE)) == copies  # reused
    np.testing.assert_array_equal(again.encode_images(pixels), int8.encode_images(pixels))


def test_int8_is_the_onnx_backends_on_cpus_only():
    with pytest.raises(BackendUnavailableError, match='int8 runs on the onnx and openvino backends'):
        create_backend('torch', TINY, BackendOptions(device='cpu', dtype='int8'))
