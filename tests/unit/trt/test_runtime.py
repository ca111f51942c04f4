"""The TensorRT backend's runtime without TensorRT: import and install errors, options, GPU detection through
cuda-python (a stand-in), and the ONNX export the engines are built from."""

import enum
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.export_format import locate_export
from clipserve.backends.tensorrt import runtime as tensorrt_runtime
from clipserve.backends.tensorrt.profiles import (
    parse_cuda_device,
    pick_precision,
)
from clipserve.backends.tensorrt.runtime import (
    INSTALL_COMMAND,
    build_failure_message,
    cuda_device,
    describe_parser_error,
    no_cuda_message,
    not_installed_message,
)
from clipserve.errors import BackendUnavailableError, EngineBuildError, WeightsUnavailableError

from ...conftest import TINY
from .fakes import CudaError, FakeCudart

HAVE_TENSORRT = importlib.util.find_spec('tensorrt') is not None


# ---- import and install errors ----------------------------------------------------------------


def test_module_imports_neither_tensorrt_nor_cuda():
    code = (
        'import sys, clipserve.backends.tensorrt.backend; '
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

    extra = tomllib.loads((Path(__file__).resolve().parents[3] / 'pyproject.toml').read_text())
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


# ---- GPU detection (cuda-python) -----------------------------------------------------------------


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
