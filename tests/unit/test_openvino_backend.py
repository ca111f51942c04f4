"""The OpenVINO backend against the torch backend on the same weights: the export it serves, its precisions
(set explicitly, checked), its devices and errors, and a replica without torch."""

import os
import subprocess
import sys

import numpy as np
import pytest

if not os.environ.get('CI'):  # CI installs the test extra, which has openvino: there a missing one fails
    # (through clipserve's module, which imports OpenVINO without its telemetry)
    pytest.importorskip(
        'clipserve.backends.openvino.runtime', reason='openvino is not installed (pip install -e ".[openvino]")'
    )

from clipserve.backends import BackendOptions, create_backend, int8_check, precision
from clipserve.backends.cpu_features import cpu_features
from clipserve.backends.openvino import compile as openvino_compile
from clipserve.backends.openvino.backend import OpenVINOBackend
from clipserve.backends.openvino.int8 import quantize
from clipserve.errors import BackendUnavailableError, WeightsUnavailableError
from clipserve.models.tokenizer import Tokenizer

from ..compare import assert_close, relative_error
from ..conftest import TINY
from ..onnx_helpers import make_clip_as_service_layout

TEXTS = ['a photo of a dog', 'a much longer caption about a dog on a red chair in a garden', '!', '']


@pytest.fixture(scope='module')
def tiny_export(tiny_onnx_export):
    return tiny_onnx_export


def _openvino(folder, **options):
    return create_backend('openvino', None, BackendOptions(device='cpu', **options), model_path=str(folder))


def _pixels(n=3, size=224):
    return np.random.default_rng(0).normal(size=(n, 3, size, size)).astype(np.float32)


def _cosine(a, b):
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture
def forced_bf16(monkeypatch):
    """Set CLIPSERVE_CPU_BF16 for one test (cpu_bf16() reads it once per process, so its cache is cleared)."""

    def force(value: str):
        monkeypatch.setenv(precision.CPU_BF16_ENV, value)
        precision.cpu_bf16.cache_clear()

    yield force
    precision.cpu_bf16.cache_clear()


def _hint(compiled) -> str:
    return compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()


@pytest.mark.precision
def test_openvino_fp32_equals_torch(tiny_export, tiny_backend):
    backend = _openvino(tiny_export, dtype='fp32')
    tokens = Tokenizer()(TEXTS)
    image_diff = relative_error(backend.encode_images(_pixels()), tiny_backend.encode_images(_pixels()))
    text_diff = relative_error(
        backend.encode_texts(tokens.input_ids, tokens.attention_mask),
        tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask),
    )
    print(f'\nopenvino fp32 vs torch ({TINY}): images {image_diff:.2e}, texts {text_diff:.2e}')
    assert image_diff < 1e-5 and text_diff < 1e-5
    assert (backend.name, backend.device, backend.dtype, backend.embed_dim) == ('openvino', 'cpu', 'fp32', 64)
    assert backend.trims_padding and backend.model_name == TINY and backend.image_size == 224
    assert (_hint(backend._visual), _hint(backend._textual)) == ('f32', 'f32')  # never OpenVINO's own bf16


def test_clip_as_service_layout(tiny_export, tiny_backend, tmp_path):
    folder = make_clip_as_service_layout(tiny_export, tmp_path / 'ViT-B-32-openai')
    backend = OpenVINOBackend(TINY, BackendOptions(device='cpu', dtype='fp32'), model_path=str(folder))
    assert not backend.trims_padding and backend.context_length == 77  # int32 ids of a fixed length
    assert backend.embed_dim == 64 and backend.image_size == 224
    tokens = Tokenizer()(TEXTS)
    assert_close(backend.encode_texts(tokens.input_ids), tiny_backend.encode_texts(tokens.input_ids), rel=1e-4)


@pytest.mark.precision
def test_auto_follows_the_cpu_bf16_detection_both_ways(tiny_export, forced_bf16):
    forced_bf16('0')
    backend = _openvino(tiny_export)
    assert backend.precision.as_dict() == {
        'images': 'fp32',
        'texts': 'fp32',
        'reason': 'auto: fp32, native bf16 forced off by CLIPSERVE_CPU_BF16',
    }
    assert (_hint(backend._visual), _hint(backend._textual)) == ('f32', 'f32')
    forced_bf16('1')
    resolved = precision.resolve_precision('openvino', 'cpu', 'auto')
    assert (resolved.images, resolved.texts) == ('bf16', 'bf16') and 'forced on' in resolved.reason
    if 'BF16' not in backend_capabilities():
        pytest.skip("OpenVINO's CPU plugin computes no bf16 on this CPU")
    backend = _openvino(tiny_export)
    assert backend.dtype == 'bf16' and (_hint(backend._visual), _hint(backend._textual)) == ('bf16', 'bf16')
    assert (
        _cosine(backend.encode_images(_pixels()), _openvino(tiny_export, dtype='fp32').encode_images(_pixels())).min()
        > 0.999
    )


def backend_capabilities() -> list:
    import openvino as ov

    return list(ov.Core().get_property('CPU', 'OPTIMIZATION_CAPABILITIES'))


@pytest.mark.precision
def test_int8_quantizes_the_matmul_weights_and_stays_close_to_fp32(tiny_export, monkeypatch):
    monkeypatch.delenv(int8_check.FORCE_ENV, raising=False)
    if not cpu_features().int8_dot:  # an AVX2 CPU: OpenVINO would compute int8 weights in fp32, no faster
        with pytest.raises(BackendUnavailableError, match='without int8 dot-product instructions'):
            _openvino(tiny_export, dtype='int8')
        monkeypatch.setenv(int8_check.FORCE_ENV, '1')
    fp32, int8 = _openvino(tiny_export, dtype='fp32'), _openvino(tiny_export, dtype='int8')
    assert int8.int8_report.batch_cosine_min > int8_check.MIN_BATCH_COSINE
    assert int8.dtype == 'int8' and (_hint(int8._visual), _hint(int8._textual)) == ('f32', 'f32')
    tokens = Tokenizer()(TEXTS)
    texts = _cosine(int8.encode_texts(tokens.input_ids), fp32.encode_texts(tokens.input_ids))
    images = _cosine(int8.encode_images(_pixels()), fp32.encode_images(_pixels()))
    print(f'\nopenvino int8 vs fp32 cosine: texts min {texts.min():.5f}, images min {images.min():.5f}')
    assert texts.min() > 0.99 and images.min() > 0.99
    assert not np.allclose(int8.encode_images(_pixels()), fp32.encode_images(_pixels()), atol=1e-5)  # it did change


@pytest.mark.parametrize('axis', [0, 1])
def test_int8_weights_are_symmetric_with_one_scale_per_output_channel(axis):
    weights = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    weights[:, 0] = weights[0, :] = 0  # an all-zero output channel keeps a usable scale
    quantized, scale = quantize(weights, axis)
    assert quantized.dtype == np.int8 and np.abs(quantized).max() == 127
    assert scale.shape == ((1, 4) if axis == 0 else (6, 1)) and (scale > 0).all()
    assert np.abs(quantized * scale - weights).max() <= scale.max() / 2 + 1e-7


@pytest.mark.parametrize(
    'dtype, words', [('fp16', "OpenVINO's CPU plugin computes fp32, bf16 or int8"), ('int4', "use one of 'fp32'")]
)
def test_unknown_precisions_are_refused_before_loading(dtype, words, tmp_path):
    with pytest.raises(BackendUnavailableError, match=words):
        _openvino(tmp_path / 'not-read', dtype=dtype)


def test_a_precision_openvino_did_not_compile_is_refused():
    """The CPU plugin compiles bf16 as f32 where the CPU cannot do bf16; that must not pass for bf16."""
    import openvino as ov

    class Compiled:
        def get_property(self, name):
            return ov.Type.f32

    class Core:
        def compile_model(self, model, device, config):
            assert device == 'CPU' and config['INFERENCE_PRECISION_HINT'] == 'bf16'
            return Compiled()

    config = openvino_compile.properties('cpu', 'bf16', None)
    with pytest.raises(
        BackendUnavailableError, match='dtype bf16 was asked for on cpu, but OpenVINO compiled visual.onnx for f32'
    ):
        openvino_compile.compile_tower(Core(), None, 'visual.onnx', 'cpu', 'bf16', config)


def test_compile_properties():
    props = openvino_compile.properties
    assert props('cpu', 'fp32', None) == {'INFERENCE_PRECISION_HINT': 'f32', 'PERFORMANCE_HINT': 'LATENCY'}
    cores = openvino_compile._usable_cores()
    assert props('cpu', 'bf16', cores)['ENABLE_CPU_PINNING'] is True  # one replica: all the cores
    if cores > 1:  # replicas share the cores: none pins its threads onto the others'
        assert props('cpu', 'bf16', 1) == {
            'INFERENCE_PRECISION_HINT': 'bf16',
            'PERFORMANCE_HINT': 'LATENCY',
            'INFERENCE_NUM_THREADS': 1,
            'ENABLE_CPU_PINNING': False,
        }
    assert props('cpu', 'int8', None)['DYNAMIC_QUANTIZATION_GROUP_SIZE'] == 32
    assert props('gpu:1', 'fp16', 2, '/cache/openvino') == {
        'INFERENCE_PRECISION_HINT': 'f16',
        'PERFORMANCE_HINT': 'LATENCY',
        'CACHE_DIR': '/cache/openvino',
    }
    assert openvino_compile.openvino_device('gpu:1') == 'GPU.1' and openvino_compile.openvino_device('cpu') == 'CPU'


@pytest.mark.parametrize(
    'available, asked, picked',
    [
        (['CPU'], None, 'cpu'),
        (['CPU', 'GPU'], None, 'cpu'),  # an Intel GPU only when named
        (['CPU', 'GPU'], 'gpu', 'gpu'),
        (['CPU', 'GPU'], 'gpu:0', 'gpu:0'),
        (['CPU', 'GPU.0', 'GPU.1'], 'GPU.1', 'gpu:1'),
    ],
)
def test_devices(available, asked, picked):
    class Core:
        available_devices = available

    assert openvino_compile.pick_device(Core(), asked) == picked


@pytest.mark.parametrize(
    'available, asked, words',
    [
        (['CPU'], 'gpu', "'gpu' was asked for, but OpenVINO .* sees no Intel GPU \\(its devices: CPU\\)"),
        (['CPU', 'GPU'], 'gpu:1', 'sees no Intel GPU 1 \\(GPUs: gpu:0\\)'),
        (['CPU', 'GPU'], 'cuda', 'unknown device .* for the openvino backend; use "cpu", "gpu", "gpu:N"'),
        (['CPU'], 'cpu:0', 'unknown device'),
    ],
)
def test_an_absent_or_unknown_device_is_refused(available, asked, words):
    class Core:
        available_devices = available

    with pytest.raises(BackendUnavailableError, match=words):
        openvino_compile.pick_device(Core(), asked)


def test_an_absent_intel_gpu_fails_at_start_never_on_the_cpu(tiny_export):
    import openvino as ov

    if any(d.startswith('GPU') for d in ov.Core().available_devices):
        pytest.skip('this machine has an Intel GPU')
    with pytest.raises(BackendUnavailableError, match='no Intel GPU'):
        create_backend('openvino', None, BackendOptions(device='gpu'), model_path=str(tiny_export))


def test_missing_openvino_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, 'openvino', None)  # `import openvino` now fails, as when not installed
    monkeypatch.delitem(sys.modules, 'clipserve.backends.openvino.backend', raising=False)
    monkeypatch.delitem(sys.modules, 'clipserve.backends.openvino.compile', raising=False)
    monkeypatch.delitem(sys.modules, 'clipserve.backends.openvino.int8', raising=False)
    monkeypatch.delitem(sys.modules, 'clipserve.backends.openvino.runtime', raising=False)
    with pytest.raises(
        BackendUnavailableError, match=r'install the openvino extra: pip install "clipserve\[openvino\]"'
    ):
        create_backend('openvino', TINY, BackendOptions(device='cpu'))


@pytest.mark.parametrize('make', [lambda p: p / 'missing', lambda p: p])
def test_bad_model_path(tmp_path, make):
    with pytest.raises(WeightsUnavailableError, match='visual.onnx and textual.onnx'):
        _openvino(make(tmp_path))


def test_a_model_name_is_served_from_its_cached_export(tiny_export, monkeypatch):
    from clipserve.backends import export_format

    asked = []
    monkeypatch.setattr(export_format, 'cached_export', lambda *a: asked.append(a) or tiny_export)
    backend = create_backend('openvino', TINY, BackendOptions(device='cpu', dtype='fp32'))
    assert asked == [(TINY, False, None)] and backend.folder == tiny_export


def test_openvino_replica_imports_neither_torch_nor_onnxruntime_nor_openvinos_telemetry(tiny_export, tmp_path):
    """Nor does it start the process OpenVINO's import sends its usage event from, which would also fix the
    multiprocessing start method (Jina's executors could then not start in fresh interpreters)."""
    code = (
        'import multiprocessing, sys; from clipserve.backends import create_backend, BackendOptions; '
        f'b = create_backend("openvino", None, BackendOptions(device="cpu"), model_path={str(tiny_export)!r}); '
        'import numpy as np; b.encode_texts(np.array([[49406, 320, 49407]])); '
        'loaded = [m for m in ("torch", "open_clip", "onnxruntime") if m in sys.modules]; '
        'assert not loaded, f"imported {loaded}"; '
        'assert sys.modules["openvino_telemetry"] is None, "telemetry imported"; '
        'assert multiprocessing.get_start_method(allow_none=True) is None, "a process was started"'
    )
    # as on a server: no CI variable (openvino-telemetry stays quiet in CI), no start method chosen for Jina
    env = {k: v for k, v in os.environ.items() if k not in ('CI', 'JINA_MP_START_METHOD')} | {'HOME': str(tmp_path)}
    subprocess.run([sys.executable, '-c', code], check=True, env=env)
    assert not (tmp_path / 'intel').exists()  # where openvino-telemetry keeps its client id


def test_int8_is_refused_on_a_cpu_without_int8_dot_products_unless_forced(tiny_export, monkeypatch):
    """The rule, on any CPU (not `precision`: on a real AVX2 CPU the test above meets the refusal itself)."""
    from clipserve.backends import cpu_features as features

    avx2 = features.combine({'avx2', 'fma'}, None, 'x86_64')
    monkeypatch.setattr(int8_check, 'cpu_features', lambda: avx2)
    monkeypatch.delenv(int8_check.FORCE_ENV, raising=False)
    with pytest.raises(BackendUnavailableError, match='without int8 dot-product instructions.*CLIPSERVE_INT8_FORCE'):
        _openvino(tiny_export, dtype='int8')
    monkeypatch.setenv(int8_check.FORCE_ENV, '1')
    assert _openvino(tiny_export, dtype='int8').dtype == 'int8'
