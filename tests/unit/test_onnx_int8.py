"""`dtype: int8` on the onnx backend: a per-row quantized copy of the export, made once, cached with an
integrity record (the cache machinery is tests/unit/test_onnx_fp16.py's), measured against fp32 on this
CPU before it serves, and refused with the figures when it breaks embeddings.

Marked `precision`: CI also runs these on an emulated AVX2 CPU (tests/unit/test_cpu_kinds.py), whose
integer kernels differ from AVX-512's.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from clipserve.backends import BackendOptions, create_backend, int8_check
from clipserve.backends.onnx.copies import INTEGRITY_FILE, MODEL_FILE
from clipserve.backends.onnx.int8 import weight_bits
from clipserve.errors import BackendUnavailableError

from ..compare import cosines
from ..conftest import TINY

pytestmark = pytest.mark.precision

TEXTS = ['a photo of a cat', 'two dogs playing in the snow', 'a diagram', 'a']


@pytest.fixture(scope='module')
def exported(tiny_onnx_export):
    return tiny_onnx_export


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache: the int8 copy is made in the test."""
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    monkeypatch.delenv(int8_check.FORCE_ENV, raising=False)
    return tmp_path / 'cache'


@pytest.fixture(scope='module')
def _module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp('int8-cache')


@pytest.fixture
def made(_module_cache, monkeypatch):
    """A cache shared by the tests that only use the int8 copy: it is made once (quantizing is most of an
    int8 start, and minutes under the emulated CPU); every load still runs the check on this CPU."""
    monkeypatch.setenv('CLIPSERVE_CACHE', str(_module_cache))
    monkeypatch.delenv(int8_check.FORCE_ENV, raising=False)
    return _module_cache


def _onnx(folder, dtype):
    return create_backend('onnx', None, BackendOptions(device='cpu', dtype=dtype), model_path=str(folder))


def _pixels(n=3):
    return np.random.default_rng(0).normal(size=(n, 3, 224, 224)).astype(np.float32)


def test_int8_is_a_cached_integer_copy_close_to_fp32(exported, cache):
    fp32, int8 = _onnx(exported, 'fp32'), _onnx(exported, 'int8')
    assert (fp32.dtype, int8.dtype) == ('fp32', 'int8')
    folder = cache / f'onnx-int8-w{weight_bits()}'
    copies = sorted(folder.glob('*/' + MODEL_FILE))
    assert [p.parent.name.split('-')[0] for p in copies] == ['textual', 'visual']
    limit = 2 ** (weight_bits() - 1) - 1  # 7 bits on CPUs without VNNI: their pair sums cannot saturate
    for copy in copies:
        assert (copy.parent / INTEGRITY_FILE).is_file()
        graph = onnx.load(str(copy)).graph
        ops = [node.op_type for node in graph.node]
        # every linear layer but the first block's and the projection (the second block's in-projection,
        # out-projection and MLP), the integer product's output scaled in its kernel; attention fused around its
        # own (quantized) in-projection, its products in float
        assert ops.count('MatMulIntegerToFloat') == 4, ops
        assert ops.count('MultiHeadAttention') == ops.count('Split') >= 2, ops
        assert 'Attention' not in ops and 'MatMulInteger' not in ops
        weights = [numpy_helper.to_array(w) for w in graph.initializer if w.data_type == onnx.TensorProto.INT8]
        assert weights and max(int(np.abs(w).max()) for w in weights) == limit
    tokens = fp32.tokenizer(TEXTS)
    texts = cosines(int8.encode_texts(tokens.input_ids, tokens.attention_mask), fp32.encode_texts(tokens.input_ids))
    images = cosines(int8.encode_images(_pixels()), fp32.encode_images(_pixels()))
    print(f'\nint8 vs fp32 cosine: texts min {texts.min():.5f}, images min {images.min():.5f}')
    assert texts.min() > 0.995 and images.min() > 0.995
    assert not np.allclose(int8.encode_images(_pixels()), fp32.encode_images(_pixels()), rtol=1e-4)  # it changed
    again = _onnx(exported, 'int8')
    assert sorted(folder.glob('*/' + MODEL_FILE)) == copies  # reused
    np.testing.assert_array_equal(again.encode_images(_pixels()), int8.encode_images(_pixels()))


def test_an_embedding_does_not_depend_on_its_batch_mates(exported, made):
    int8 = _onnx(exported, 'int8')
    pixels = _pixels(9)
    batched = int8.encode_images(pixels)
    alone = np.concatenate([int8.encode_images(pixels[i : i + 1]) for i in range(len(pixels))])
    assert cosines(alone, batched).min() > 0.99999
    tokens = int8.tokenizer(TEXTS)
    together = int8.encode_texts(tokens.input_ids, tokens.attention_mask)
    for i, text in enumerate(TEXTS):  # alone, a short text runs at its own length: no padding to share
        one = int8.tokenizer([text])
        assert cosines(int8.encode_texts(one.input_ids, one.attention_mask), together[i : i + 1]).min() > 0.99999


def test_the_check_on_this_cpu_is_reported(exported, made):
    int8 = _onnx(exported, 'int8')
    report = int8.int8_report
    assert report.image_cosine_min > int8_check.MIN_COSINE and report.text_cosine_min > int8_check.MIN_COSINE
    assert report.batch_cosine_min > int8_check.MIN_BATCH_COSINE and report.image_speedup > 0
    assert 'int8 vs fp32 on this CPU' in int8.precision.reason and report.cpu in int8.precision.reason
    assert int8.model_calls == 0  # the check's forward passes are not the replica's


def test_int8_that_misses_the_bounds_is_refused_with_the_figures_unless_forced(exported, made, monkeypatch):
    monkeypatch.setattr(int8_check, 'MIN_COSINE', 0.9999999)  # stricter than any int8 reaches
    with pytest.raises(BackendUnavailableError) as refused:
        _onnx(exported, 'int8')
    message = str(refused.value)
    assert 'refused on this CPU' in message and 'min cosine' in message and int8_check.FORCE_ENV in message
    monkeypatch.setenv(int8_check.FORCE_ENV, '1')
    forced = _onnx(exported, 'int8')
    assert forced.dtype == 'int8' and 'SERVED ANYWAY' in forced.precision.reason


def test_enforce_names_each_failure():
    report = int8_check.Int8Report(0.97, 0.999, 0.9990, 1.7, 2.0, 'avx2 (avx2, fma)')
    assert len(report.failures) == 2
    with pytest.raises(BackendUnavailableError, match='image embeddings drift.*depends on its batch mates'):
        int8_check.enforce(report, 'onnx', environ={})
    assert 'SERVED ANYWAY' in int8_check.enforce(report, 'onnx', environ={int8_check.FORCE_ENV: '1'})
    good = int8_check.Int8Report(0.999, 0.999, 1.0, 1.7, 2.0, 'avx2 (avx2, fma)')
    assert int8_check.enforce(good, 'onnx', environ={}).startswith('int8 vs fp32 on this CPU (avx2')


def test_int8_is_the_onnx_backends_on_cpus_only():
    with pytest.raises(BackendUnavailableError, match='int8 runs on the onnx and openvino backends'):
        create_backend('torch', TINY, BackendOptions(device='cpu', dtype='int8'))


def test_weights_use_7_bits_where_pair_sums_could_saturate_and_8_with_int8_dot_products(monkeypatch):
    from clipserve.backends import cpu_features as features
    from clipserve.backends.onnx import int8

    for flags, bits in (({'avx2', 'fma'}, 7), ({'avx2', 'fma', 'avx512f', 'avx512_vnni'}, 8)):
        monkeypatch.setattr(int8, 'cpu_features', lambda flags=flags: features.combine(flags, None))
        assert int8.weight_bits() == bits


def test_channel_scales_round_better_than_the_largest_weight_alone():
    from clipserve.backends.onnx.int8 import channel_scales

    weights = np.random.default_rng(3).standard_t(3, size=(768, 64)).astype(np.float32)  # heavy tails
    plain = np.abs(weights).max(axis=0) / 63

    def error(scale):
        return float(((np.clip(np.round(weights / scale), -63, 63) * scale - weights) ** 2).sum())

    assert error(channel_scales(weights, 63)) < error(plain)  # never worse: ratio 1 is among the candidates


def test_the_first_block_and_the_last_layer_stay_float():
    from clipserve.backends.int8_layers import float_layers

    clip = [(512, 1536), (512, 512), (512, 2048), (2048, 512)] * 12 + [(512, 512)]  # fused qkv, then projection
    assert float_layers(clip) == {0, 1, 2, 3, 48}
    bert = [(384, 384)] * 4 + [(384, 1536), (1536, 384)]  # separate q, k, v: q, k, v, out would repeat as 1
    assert float_layers(bert * 6 + [(384, 384), (384, 1)]) == {0, 1, 2, 3, 4, 5, 37}
    assert float_layers([(8, 8), (8, 4), (4, 2)]) == {2}  # no block repeats: the last layer alone
    assert float_layers([]) == set()


def test_the_int8_copy_keeps_the_first_block_and_the_projection_in_float(exported, made):
    from clipserve.backends.onnx.int8 import quantize_linear_layers

    for tower in ('textual.onnx', 'visual.onnx'):
        model = onnx.load(str(exported / tower))
        weights = {w.name for w in model.graph.initializer}
        linear = [n for n in model.graph.node if n.op_type in ('MatMul', 'Gemm') and n.input[1] in weights]
        count = quantize_linear_layers(model)
        kept = [n for n in model.graph.node if n.op_type in ('MatMul', 'Gemm') and n.input[1] in weights]
        assert count == len(linear) - len(kept) and count > 0
        assert [n.name for n in kept] == [n.name for n in linear[: len(kept) - 1]] + [linear[-1].name]
