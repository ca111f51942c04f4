"""The TensorRT backend without TensorRT: cache keys, profiles, engine invalidation, errors, and the whole
backend driven through a stand-in for TensorRT and cuda-python (`FakeTRT`, `FakeCudart`) that follows the
TensorRT 10 Python API the backend calls and runs the ONNX graphs in onnxruntime. The stand-in proves
the plumbing (shapes, buffers, copies, caching, errors), not TensorRT's numerics; the tests marked `gpu`
run the real thing and are skipped where TensorRT cannot be imported.
"""

import dataclasses
import enum
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from clipserve.backends import BackendOptions, create_backend, tensorrt_profiles, tensorrt_runtime
from clipserve.backends import tensorrt_backend as trb
from clipserve.backends.export_format import locate_export
from clipserve.backends.tensorrt_cache import (
    EngineKey,
    engine_path,
    load_or_build,
    onnx_sha256,
    sidecar_path,
    stale_reason,
    timing_cache_path,
    write_engine,
)
from clipserve.backends.tensorrt_profiles import (
    ShapeProfile,
    image_profiles,
    parse_cuda_device,
    pick_precision,
    profile_signature,
    text_profiles,
)
from clipserve.backends.tensorrt_runtime import (
    INSTALL_COMMAND,
    build_failure_message,
    cuda_device,
    describe_parser_error,
    no_cuda_message,
    not_installed_message,
)
from clipserve.errors import BackendUnavailableError, EngineBuildError, InvalidParameterError, WeightsUnavailableError
from clipserve.models.tokenizer import Tokenizer

from ..conftest import TINY

HAVE_TENSORRT = importlib.util.find_spec('tensorrt') is not None
NO_TENSORRT = 'TensorRT is not installed here (it needs pypi.nvidia.com and an NVIDIA GPU)'
TEXTS = ['a photo of a dog', 'a much longer caption about a dog on a red chair in a garden', '!', '']

KEY = EngineKey(
    tower='visual',
    onnx_sha256='a' * 64,
    tensorrt_version='10.3.0',
    gpu_name='NVIDIA H200',
    compute_capability='9.0',
    precision='fp16',
    profile='pixel_values=1x3x224x224/32x3x224x224/32x3x224x224',
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    return tmp_path / 'cache'


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory):
    from clipserve.backends.onnx_export import export_onnx

    out = tmp_path_factory.mktemp('tiny-onnx-for-trt')
    export_onnx(TINY, out)
    return out


def _pixels(n, size=224):
    return np.random.default_rng(0).normal(size=(n, 3, size, size)).astype(np.float32)


def _cosine_distance(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((1 - (a * b).sum(axis=1)).max())


# ---- import and install errors ----------------------------------------------------------------


def test_module_imports_neither_tensorrt_nor_cuda():
    code = (
        'import sys, clipserve.backends.tensorrt_backend; '
        'print(sorted(m for m in ("tensorrt", "cuda", "torch") if m in sys.modules))'
    )
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'


@pytest.mark.skipif(HAVE_TENSORRT, reason='TensorRT is installed here')
def test_create_backend_without_tensorrt_names_the_install_command(cache):
    with pytest.raises(BackendUnavailableError) as info:
        create_backend('tensorrt', TINY, BackendOptions())
    message = str(info.value)
    assert INSTALL_COMMAND in message and 'pypi.nvidia.com' in message and 'import tensorrt failed' in message
    assert not cache.exists()  # failed before exporting or building anything


def test_tensorrt_import_failure_is_backend_unavailable(monkeypatch, cache):
    monkeypatch.setitem(sys.modules, 'tensorrt', None)  # makes `import tensorrt` raise ImportError
    with pytest.raises(BackendUnavailableError, match='pip install "clipserve\\[tensorrt\\]"'):
        create_backend('tensorrt', TINY, BackendOptions(device='cuda'), max_batch=8)


def test_old_tensorrt_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, 'tensorrt', types.SimpleNamespace(__version__='8.6.1'))
    with pytest.raises(BackendUnavailableError, match='found TensorRT 8.6.1'):
        tensorrt_runtime.import_tensorrt()


def test_tensorrt_11_is_refused_with_the_reason(monkeypatch):
    # TensorRT 11 removed BuilderFlag.FP16: without this check a fresh install failed with an AttributeError
    monkeypatch.setitem(sys.modules, 'tensorrt', types.SimpleNamespace(__version__='11.4.0.106'))
    with pytest.raises(BackendUnavailableError, match='found TensorRT 11.4.0.106.*removed BuilderFlag.FP16'):
        tensorrt_runtime.import_tensorrt()


def test_the_extra_caps_tensorrt_below_11():
    import tomllib

    extra = tomllib.loads((Path(__file__).resolve().parents[2] / 'pyproject.toml').read_text())
    assert 'tensorrt>=10,<11' in extra['project']['optional-dependencies']['tensorrt']


def test_missing_cuda_python_is_backend_unavailable(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cuda(name, *args, **kwargs):
        if name == 'cuda' or name.startswith('cuda.'):
            raise ImportError(f'No module named {name!r}')
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, '__import__', no_cuda)
    with pytest.raises(BackendUnavailableError, match='cuda-python is missing'):
        tensorrt_runtime.import_cudart()


def test_messages_say_what_and_how():
    assert INSTALL_COMMAND in not_installed_message('x') and 'never falls back' in not_installed_message('x')
    message = no_cuda_message('cuda:1', 'only 1 CUDA device(s) are visible')
    assert 'cuda:1' in message and 'only 1 CUDA device' in message and 'nvidia-smi' in message
    message = build_failure_message(
        'textual', Path('/m/textual.onnx'), 'parsing', ['node 7 (/attn/Softmax, Softmax): unsupported', 'dup', 'dup']
    )
    assert 'parsing the textual engine from /m/textual.onnx' in message and '/attn/Softmax' in message
    assert message.count('dup') == 1
    assert 'no error message' in build_failure_message('visual', Path('v.onnx'), 'building', [])


def test_parser_error_description():
    class Error:  # TensorRT 10's IParserError
        def desc(self):
            return 'Unsupported operator FooBar'

        def node(self):
            return 12

        def node_name(self):
            return '/visual/transformer/FooBar_3'

        def node_operator(self):
            return 'FooBar'

    assert (
        describe_parser_error(Error()) == 'node 12 (/visual/transformer/FooBar_3, FooBar): Unsupported operator FooBar'
    )

    class OldError:  # before TensorRT 10: no node_name / node_operator
        def desc(self):
            return 'bad graph'

        def node(self):
            return -1

    assert describe_parser_error(OldError()) == 'bad graph'


# ---- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize('device,index', [(None, 0), ('', 0), ('cuda', 0), ('cuda:0', 0), ('cuda:3', 3)])
def test_cuda_device_index(device, index):
    assert parse_cuda_device(device) == index


@pytest.mark.parametrize(
    'device,words',
    [
        ('cpu', 'NVIDIA GPUs only'),
        ('cuda:x', 'unknown device'),
        ('mps', 'unknown device'),
        ('cuda:-1', 'unknown device'),
        ('gpu', 'unknown device'),
    ],
)
def test_cuda_device_refused(device, words):
    with pytest.raises(BackendUnavailableError, match=words):
        parse_cuda_device(device)


def test_precision():
    assert pick_precision(None) == 'fp16' and pick_precision('fp32') == 'fp32' and pick_precision('fp16') == 'fp16'
    for bad in ('bf16', 'int8'):
        with pytest.raises(BackendUnavailableError, match='fp16 or fp32|fp32 or fp16'):
            pick_precision(bad)


# ---- profiles ---------------------------------------------------------------------------------


def test_image_profile():
    (p,) = image_profiles(32, 224)
    assert p == ShapeProfile('pixel_values', (1, 3, 224, 224), (32, 3, 224, 224), (32, 3, 224, 224))
    (p,) = image_profiles(1, 336)
    assert p.min == p.opt == p.max == (1, 3, 336, 336)


def test_text_profile_dynamic_and_static():
    ids, mask = text_profiles(64, 77, dynamic_sequence=True)
    assert (ids.name, mask.name) == ('input_ids', 'attention_mask')
    assert ids.min == (1, 1) and ids.opt == (64, tensorrt_profiles.OPT_TEXT_LENGTH) and ids.max == (64, 77)
    assert (mask.min, mask.opt, mask.max) == (ids.min, ids.opt, ids.max)
    (ids,) = text_profiles(8, 77, dynamic_sequence=False, names=('input_ids',))
    assert ids.min == (1, 77) and ids.opt == (8, 77) and ids.max == (8, 77)
    (short,) = text_profiles(4, 8, dynamic_sequence=True, names=('input_ids',))
    assert short.opt == (4, 8)  # opt never exceeds the context


@pytest.mark.parametrize('bad', [0, -1, 2.5, True, '32'])
def test_max_batch_must_be_positive_int(bad):
    with pytest.raises(InvalidParameterError):
        image_profiles(bad, 224)


def test_profile_signature_is_canonical_and_sensitive():
    a = text_profiles(32, 77, True)
    assert profile_signature(a) == profile_signature(tuple(reversed(a)))
    assert profile_signature(a) != profile_signature(text_profiles(64, 77, True))
    assert profile_signature(a) != profile_signature(text_profiles(32, 77, False))
    assert profile_signature(image_profiles(32, 224)) == 'pixel_values=1x3x224x224/32x3x224x224/32x3x224x224'


# ---- cache keys and paths ---------------------------------------------------------------------


@pytest.mark.parametrize('field', [f.name for f in dataclasses.fields(EngineKey)])
def test_engine_key_changes_with_every_component(field):
    value = getattr(KEY, field)
    other = dataclasses.replace(KEY, **{field: value + 1 if isinstance(value, int) else value + '-other'})
    assert other.digest() != KEY.digest() and engine_path(other) != engine_path(KEY)


def test_engine_key_is_stable(cache):
    assert dataclasses.replace(KEY).digest() == KEY.digest()
    path = engine_path(KEY)
    assert path.parent == cache / 'tensorrt' and path.name.startswith('visual-fp16-') and path.suffix == '.engine'
    assert sidecar_path(path) == path.with_suffix('.json')


def test_timing_cache_per_gpu_and_version(cache):
    base = timing_cache_path('10.3.0', 'NVIDIA H200', '9.0')
    assert base.parent == cache / 'tensorrt' and ' ' not in base.name
    assert base != timing_cache_path('10.4.0', 'NVIDIA H200', '9.0')
    assert base != timing_cache_path('10.3.0', 'NVIDIA A100-SXM4-80GB', '8.0')
    assert base != timing_cache_path('10.3.0', 'NVIDIA H200', '9.1')


def test_onnx_hash_covers_graph_and_external_data(tmp_path):
    graph = tmp_path / 'visual.onnx'
    graph.write_bytes(b'graph')
    plain = onnx_sha256(graph)
    (tmp_path / 'visual.onnx.data').write_bytes(b'weights')
    with_data = onnx_sha256(graph)
    (tmp_path / 'visual.onnx.data').write_bytes(b'weightz')
    assert len({plain, with_data, onnx_sha256(graph)}) == 3
    graph.write_bytes(b'graph2')
    assert onnx_sha256(graph) not in {plain, with_data}


# ---- stale and corrupt engines ----------------------------------------------------------------


def test_fresh_engine_is_loadable(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    assert stale_reason(engine, KEY) is None
    assert json.loads(sidecar_path(engine).read_text())['key'] == KEY.as_dict()


def test_missing_engine_or_sidecar(tmp_path):
    engine = engine_path(KEY, tmp_path)
    assert stale_reason(engine, KEY) == 'no cached engine'
    engine.write_bytes(b'plan-bytes')
    assert 'missing' in stale_reason(engine, KEY)


@pytest.mark.parametrize(
    'sidecar', ['{not json', '[]', '{"key": {}}', '{"key": {}, "engine_bytes": "x", "engine_sha256": 1}']
)
def test_unreadable_sidecar(tmp_path, sidecar):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    sidecar_path(engine).write_text(sidecar)
    assert stale_reason(engine, KEY) is not None


@pytest.mark.parametrize(
    'field,value',
    [
        ('tensorrt_version', '10.4.0'),
        ('gpu_name', 'NVIDIA A100'),
        ('compute_capability', '8.0'),
        ('precision', 'fp32'),
        ('onnx_sha256', 'b' * 64),
    ],
)
def test_key_mismatch_names_what_changed(tmp_path, field, value):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, dataclasses.replace(KEY, **{field: value}), b'plan-bytes')  # e.g. copied from another machine
    reason = stale_reason(engine, KEY)
    assert field in reason and value in reason


def test_truncated_and_corrupt_engines(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    engine.write_bytes(b'plan')
    assert 'truncated' in stale_reason(engine, KEY)
    engine.write_bytes(b'plan-bytez')  # same size, other bytes
    assert 'sha256' in stale_reason(engine, KEY)


def test_load_or_build_uses_a_fresh_cache(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    built = []
    result = load_or_build(engine, KEY, lambda blob: ('engine', blob), lambda: built.append(1) or b'new')
    assert result == (('engine', b'plan-bytes'), None) and not built


@pytest.mark.parametrize('deserialize_old', [lambda blob: None, lambda blob: 1 / 0])
def test_load_or_build_rebuilds_what_tensorrt_rejects(tmp_path, deserialize_old):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'old-plan')

    def deserialize(blob):
        return deserialize_old(blob) if blob == b'old-plan' else ('engine', blob)

    result, reason = load_or_build(engine, KEY, deserialize, lambda: b'new-plan')
    assert result == ('engine', b'new-plan') and 'deserialize' in reason
    assert engine.read_bytes() == b'new-plan' and stale_reason(engine, KEY) is None


def test_load_or_build_rebuilds_stale_and_fails_loudly(tmp_path):
    engine = engine_path(KEY, tmp_path)
    engine.parent.mkdir(parents=True, exist_ok=True)
    engine.write_bytes(b'no sidecar')
    result, reason = load_or_build(engine, KEY, lambda blob: blob, lambda: b'plan')
    assert result == b'plan' and 'missing' in reason
    (tmp_path / 'x').mkdir()
    with pytest.raises(EngineBuildError, match='could not deserialize'):
        load_or_build(engine_path(KEY, tmp_path / 'x'), KEY, lambda blob: None, lambda: b'plan')


# ---- GPU detection (cuda-python) -----------------------------------------------------------------


class CudaError(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100


class FakeCudart:
    """cuda-python's runtime API as the backend uses it; 'device memory' is host memory, copies are memmoves."""

    cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)

    def __init__(self, count=1, error=CudaError.cudaSuccess, name=b'NVIDIA Fake H200\x00\x00\x00', cc=(9, 0)):
        self.count, self.error, self.name, self.cc = count, error, name, cc
        self.buffers, self.streams, self.current = {}, 0, None

    def cudaGetErrorString(self, error):
        return CudaError.cudaSuccess, f'error {int(error)}'.encode()

    def cudaGetDeviceCount(self):
        return (self.error, None) if self.error else (CudaError.cudaSuccess, self.count)

    def cudaGetDeviceProperties(self, index):
        return CudaError.cudaSuccess, types.SimpleNamespace(name=self.name, major=self.cc[0], minor=self.cc[1])

    def cudaSetDevice(self, index):
        self.current = index
        return (CudaError.cudaSuccess,)

    def cudaStreamCreate(self):
        self.streams += 1
        return CudaError.cudaSuccess, self.streams

    def cudaStreamDestroy(self, stream):
        self.streams -= 1
        return (CudaError.cudaSuccess,)

    def cudaStreamSynchronize(self, stream):
        return (CudaError.cudaSuccess,)

    def cudaMalloc(self, nbytes):
        buffer = np.zeros(nbytes, dtype=np.uint8)
        self.buffers[buffer.ctypes.data] = buffer
        return CudaError.cudaSuccess, buffer.ctypes.data

    def cudaFree(self, pointer):
        self.buffers.pop(pointer)
        return (CudaError.cudaSuccess,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):
        import ctypes

        device = dst if kind == 1 else src
        assert device in self.buffers and nbytes <= self.buffers[device].nbytes, 'copy outside a device buffer'
        ctypes.memmove(dst, src, nbytes)
        return (CudaError.cudaSuccess,)


def test_gpu_name_and_capability():
    gpu = cuda_device(FakeCudart(count=2, cc=(8, 6)), 1, 'cuda:1')
    assert (gpu.index, gpu.name, gpu.compute_capability) == (1, 'NVIDIA Fake H200', '8.6')


@pytest.mark.parametrize(
    'cudart,words',
    [
        (FakeCudart(error=CudaError.cudaErrorInsufficientDriver), 'cudaErrorInsufficientDriver'),
        (FakeCudart(count=0), 'no CUDA device is visible'),
        (FakeCudart(count=1), 'only 1 CUDA device'),
    ],
)
def test_no_gpu_is_backend_unavailable(cudart, words):
    with pytest.raises(BackendUnavailableError, match=words):
        cuda_device(cudart, 1 if 'only' in words else 0, 'cuda')


def test_real_cuda_python_without_a_gpu():
    try:
        cudart = tensorrt_runtime.import_cudart()
    except BackendUnavailableError:
        pytest.skip('cuda-python is not installed')
    error, count = cudart.cudaGetDeviceCount()
    if int(error) == 0 and count > 0:
        pytest.skip('this machine has a GPU')
    with pytest.raises(BackendUnavailableError, match='the tensorrt backend runs on an NVIDIA GPU'):
        cuda_device(cudart, 0, 'cuda')


def test_numpy_dtype_of_engine_tensors():
    def nptype(data_type):
        return {'DataType.FLOAT': np.float32}[str(data_type)]  # an nptype without INT64

    trt = types.SimpleNamespace(nptype=nptype)
    DataType = enum.Enum('DataType', 'FLOAT INT64 FP8')
    assert tensorrt_runtime.numpy_dtype(trt, DataType.FLOAT) == np.float32
    assert tensorrt_runtime.numpy_dtype(trt, DataType.INT64) == np.int64
    with pytest.raises(EngineBuildError, match='no numpy equivalent'):
        tensorrt_runtime.numpy_dtype(trt, DataType.FP8)


# ---- the export the engines are built from -----------------------------------------------------


def test_model_path_must_be_a_clipserve_export(tmp_path):
    required = ('visual.onnx', 'textual.onnx', 'clipserve.json')  # what the tensorrt backend asks for
    with pytest.raises(WeightsUnavailableError, match='missing: visual.onnx, textual.onnx, clipserve.json'):
        locate_export(None, str(tmp_path), required=required)
    for name in ('visual.onnx', 'textual.onnx'):
        (tmp_path / name).write_bytes(b'')
    with pytest.raises(WeightsUnavailableError, match=r'missing: clipserve.json\).*clipserve export onnx'):
        locate_export(None, str(tmp_path), required=required)
    (tmp_path / 'clipserve.json').write_text('{}')
    assert locate_export(None, str(tmp_path), required=required) == tmp_path


def test_model_name_uses_the_onnx_export_cache(cache, monkeypatch):
    from clipserve.backends import export_format

    target = export_format.export_cache_dir(TINY)
    target.mkdir(parents=True)
    (target / 'clipserve.json').write_text('{}')
    monkeypatch.setattr(export_format, 'export_in_subprocess', lambda *a: pytest.fail('exported again'))
    assert locate_export(TINY, None) == target


# ---- the whole backend on a stand-in for TensorRT ------------------------------------------------


class FakeTRT(types.ModuleType):
    """The TensorRT 10 Python API surface TensorRTBackend calls, with onnxruntime as the 'engine'.

    A serialized 'engine' is JSON naming the ONNX file and the profile; deserializing checks its
    header. `parse_error` makes the ONNX parser fail the way TensorRT reports it.
    """

    class Severity(enum.IntEnum):
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    class TensorIOMode(enum.Enum):
        NONE, INPUT, OUTPUT = range(3)

    def __init__(self):
        super().__init__('tensorrt')
        self.__version__ = '10.99.0'
        self.parse_error = None
        self.builds = []
        fake = self

        class ILogger:
            Severity = FakeTRT.Severity

            def __init__(self):
                pass

        class ParserError:
            def __init__(self, desc, node, name, op):
                self._d = (desc, node, name, op)

            def desc(self):
                return self._d[0]

            def node(self):
                return self._d[1]

            def node_name(self):
                return self._d[2]

            def node_operator(self):
                return self._d[3]

        class Network:
            def __init__(self):
                self.inputs = []

            @property
            def num_inputs(self):
                return len(self.inputs)

            def get_input(self, i):
                return types.SimpleNamespace(name=self.inputs[i])

        class OnnxParser:
            def __init__(self, network, logger):
                self.network, self.logger, self.errors = network, logger, []

            def parse_from_file(self, path):
                import onnxruntime as ort

                if fake.parse_error:
                    self.errors.append(ParserError(*fake.parse_error))
                    self.logger.log(FakeTRT.Severity.ERROR, 'ModelImporter: failed to import node')
                    return False
                try:
                    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
                except Exception as e:  # TensorRT returns False and records the error
                    self.errors.append(ParserError(f'failed to load the ONNX model: {e}', -1, '', ''))
                    return False
                self.network.inputs = [i.name for i in session.get_inputs()]
                self.network.path = path
                return True

            @property
            def num_errors(self):
                return len(self.errors)

            def get_error(self, i):
                return self.errors[i]

        class Profile:
            def __init__(self):
                self.shapes = {}

            def set_shape(self, name, mn, opt, mx):
                assert all(a <= b <= c for a, b, c in zip(mn, opt, mx)), (mn, opt, mx)
                self.shapes[name] = [list(mn), list(opt), list(mx)]

        class TimingCache:
            def __init__(self, data):
                self.data = bytes(data) or b'timing'

            def serialize(self):
                return self.data

        class Config:
            def __init__(self):
                self.flags, self.profiles, self.timing = {'TF32'}, [], None

            def set_flag(self, flag):
                self.flags.add(flag)

            def clear_flag(self, flag):
                self.flags.discard(flag)

            def add_optimization_profile(self, profile):
                self.profiles.append(profile)
                return 0

            def create_timing_cache(self, data):
                return TimingCache(data)

            def set_timing_cache(self, cache, ignore_mismatch):
                self.timing = cache
                return True

        class Builder:
            def __init__(self, logger):
                self.logger = logger

            def create_network(self, flags):
                assert flags == 0  # explicit batch is TensorRT 10's only mode
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                assert len(config.profiles) == 1 and config.timing is not None
                fake.builds.append({'flags': sorted(config.flags), 'path': network.path})
                return json.dumps(
                    {'fake-engine': 1, 'path': network.path, 'profile': config.profiles[0].shapes}
                ).encode()

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, blob):
                try:
                    plan = json.loads(bytes(blob))
                    assert plan['fake-engine'] == 1
                except (ValueError, AssertionError, KeyError):
                    return None  # what TensorRT does with a plan it cannot read
                return Engine(plan)

        class Engine:
            def __init__(self, plan):
                import onnxruntime as ort

                self.session = ort.InferenceSession(plan['path'], providers=['CPUExecutionProvider'])
                self.profile = plan['profile']
                self.io = [(i.name, i, FakeTRT.TensorIOMode.INPUT) for i in self.session.get_inputs()]
                self.io += [(o.name, o, FakeTRT.TensorIOMode.OUTPUT) for o in self.session.get_outputs()]

            @property
            def num_io_tensors(self):
                return len(self.io)

            def get_tensor_name(self, i):
                return self.io[i][0]

            def _info(self, name):
                return next(i for i in self.io if i[0] == name)

            def get_tensor_mode(self, name):
                return self._info(name)[2]

            def get_tensor_dtype(self, name):
                return {'tensor(int64)': np.int64, 'tensor(float)': np.float32}[self._info(name)[1].type]

            def get_tensor_shape(self, name):
                return [d if isinstance(d, int) else -1 for d in self._info(name)[1].shape]

            def get_tensor_profile_shape(self, name, index):
                assert index == 0
                return self.profile[name]

            def create_execution_context(self):
                return Context(self)

        class Context:
            def __init__(self, engine):
                self.engine, self.shapes, self.addresses = engine, {}, {}

            def set_input_shape(self, name, shape):
                mn, _, mx = self.engine.profile[name]
                if len(shape) != len(mn) or not all(a <= s <= b for a, s, b in zip(mn, shape, mx)):
                    return False
                self.shapes[name] = tuple(shape)
                return True

            def get_tensor_shape(self, name):
                if self.engine.get_tensor_mode(name) == FakeTRT.TensorIOMode.INPUT:
                    return self.shapes.get(name, self.engine.get_tensor_shape(name))
                batch = next(iter(self.shapes.values()))[0]
                return [batch, self.engine.get_tensor_shape(name)[-1]]

            def set_tensor_address(self, name, address):
                self.addresses[name] = address

            def execute_async_v3(self, stream_handle):
                import ctypes

                assert isinstance(stream_handle, int)
                feeds = {}
                for name, info, mode in self.engine.io:
                    if mode == FakeTRT.TensorIOMode.INPUT:
                        dtype, shape = np.dtype(self.engine.get_tensor_dtype(name)), self.shapes[name]
                        raw = (ctypes.c_char * (int(np.prod(shape)) * dtype.itemsize)).from_address(
                            self.addresses[name]
                        )
                        feeds[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
                out = np.ascontiguousarray(self.engine.session.run(None, feeds)[0], dtype=np.float32)
                ctypes.memmove(self.addresses[self.engine.io[-1][0]], out.ctypes.data, out.nbytes)
                return True

        self.ILogger, self.Logger, self.Builder, self.Runtime, self.OnnxParser = (
            ILogger,
            ILogger,
            Builder,
            Runtime,
            OnnxParser,
        )
        self.BuilderFlag = types.SimpleNamespace(FP16='FP16', TF32='TF32')
        self.nptype = lambda dtype: dtype


@pytest.fixture
def fake_trt(monkeypatch, cache):
    fake, cudart = FakeTRT(), FakeCudart()
    monkeypatch.setitem(sys.modules, 'tensorrt', fake)
    monkeypatch.setattr(trb, 'import_cudart', lambda: cudart)
    fake.cudart = cudart
    return fake


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
    np.testing.assert_allclose(images, tiny_backend.encode_images(pixels), atol=1e-4)
    np.testing.assert_allclose(texts, tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask), atol=1e-4)
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
