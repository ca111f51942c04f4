"""TensorRT and CUDA themselves: importing them (with clear errors and version limits), the GPU's facts,
building an engine from an ONNX graph, and running one tower's engine on its own stream and buffers.
TensorRT and cuda-python are imported only when called, so this module imports without them."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clipserve.backends.tensorrt.cache import atomic_write
from clipserve.errors import BackendUnavailableError, EngineBuildError

INSTALL_COMMAND = 'pip install "clipserve[tensorrt]"'
MIN_TENSORRT_MAJOR = 10  # the named-tensor API and execute_async_v3
MAX_TENSORRT_MAJOR = 10  # TensorRT 11 removed BuilderFlag.FP16, which the fp16 engines are built with

logger = logging.getLogger(__name__)


# ---- error messages ---------------------------------------------------------------------------


def not_installed_message(cause: object) -> str:
    """Why the backend cannot start without TensorRT, and the exact command that fixes it."""
    return (
        f'the tensorrt backend needs TensorRT {MIN_TENSORRT_MAJOR}.x and cuda-python ({cause}). '
        f'Install them with: {INSTALL_COMMAND}  -- the tensorrt wheel downloads its libraries from '
        "NVIDIA's package index (pypi.nvidia.com), which must be reachable; without it, install TensorRT "
        'from NVIDIA\'s tar or deb packages. Or choose backend "onnx" or "torch" yourself: clipserve '
        'never falls back to another backend.'
    )


def no_cuda_message(device: str, detail: str) -> str:
    """The backend runs only on an NVIDIA GPU; say what CUDA reported and what to check."""
    return (
        f'the tensorrt backend runs on an NVIDIA GPU, but {detail} (device {device!r}, '
        f'CUDA_VISIBLE_DEVICES={os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")}). Check the driver with '
        '`nvidia-smi`, or choose backend "onnx" or "torch" with device "cpu".'
    )


def describe_parser_error(error) -> str:
    """One line per ONNX parser error: the node (index, name, operator) TensorRT names, then its description.

    Duck-typed on TensorRT's IParserError (`node_name`/`node_operator` exist from TensorRT 10 on).
    """

    def call(attribute, default):
        method = getattr(error, attribute, None)
        try:
            return method() if callable(method) else default
        except Exception:  # an accessor missing in this TensorRT version must not hide the error itself
            return default

    desc = str(call('desc', error)).strip()
    node, name, operator = call('node', -1), call('node_name', ''), call('node_operator', '')
    where = []
    if isinstance(node, int) and node >= 0:
        where.append(f'node {node}')
    if name or operator:
        where.append('(' + ', '.join(str(p) for p in (name, operator) if p) + ')')
    return f'{" ".join(where)}: {desc}' if where else desc


def build_failure_message(tower: str, onnx_file: Path, stage: str, errors: list[str]) -> str:
    """What failed (parsing or building which tower from which file), with TensorRT's own messages."""
    shown = list(dict.fromkeys(e.strip() for e in errors if e and e.strip()))  # de-duplicated, in order
    body = '\n  '.join(shown[:20]) if shown else '(TensorRT reported no error message)'
    more = f'\n  ... and {len(shown) - 20} more' if len(shown) > 20 else ''
    return (
        f'TensorRT failed {stage} the {tower} engine from {onnx_file}:\n  {body}{more}\n'
        'The same export runs on backend "onnx"; when reporting this, quote the node above and your TensorRT version.'
    )


# ---- TensorRT and CUDA (imported only here) ---------------------------------------------------------


def _version_major(version: str) -> int:
    match = re.match(r'(\d+)', str(version))
    return int(match.group(1)) if match else 0


def import_tensorrt():
    """`import tensorrt`, or BackendUnavailableError with the install command; never a fallback."""
    try:
        import tensorrt as trt
    except (ImportError, OSError) as e:  # OSError: the wheel is there, its libnvinfer is not
        raise BackendUnavailableError(not_installed_message(f'import tensorrt failed: {e}')) from e
    version = getattr(trt, '__version__', '0')
    if not MIN_TENSORRT_MAJOR <= _version_major(version) <= MAX_TENSORRT_MAJOR:
        raise BackendUnavailableError(
            not_installed_message(
                f'found TensorRT {version}, outside the supported {MIN_TENSORRT_MAJOR}.x'
                + (
                    ': TensorRT 11 removed BuilderFlag.FP16, which the fp16 engines use'
                    if _version_major(version) > MAX_TENSORRT_MAJOR
                    else ''
                )
            )
        )
    return trt


def import_cudart():
    """cuda-python's runtime API: `cuda.bindings.runtime` (cuda-python 12.6+), else the older `cuda.cudart`."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError as e:
            raise BackendUnavailableError(not_installed_message(f'cuda-python is missing: {e}')) from e
    return cudart


def _cuda_error_text(cudart, error) -> str:
    try:
        text = cudart.cudaGetErrorString(error)[1]
        text = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        text = ''
    return f'{getattr(error, "name", error)}: {text}' if text else str(getattr(error, 'name', error))


def check_cuda(cudart, result, what: str):
    """cuda-python returns (error, *values); raise on an error, return the value(s)."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f'{what} failed: {_cuda_error_text(cudart, error)}')
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    compute_capability: str


def cuda_device(cudart, index: int, device: str) -> GpuInfo:
    """The GPU `index` names, or BackendUnavailableError saying what CUDA reported: no driver, no GPU, too few."""
    error, count = cudart.cudaGetDeviceCount()
    if int(error) != 0:
        raise BackendUnavailableError(no_cuda_message(device, f'CUDA reports {_cuda_error_text(cudart, error)}'))
    if count == 0:
        raise BackendUnavailableError(no_cuda_message(device, 'no CUDA device is visible'))
    if index >= count:
        raise BackendUnavailableError(no_cuda_message(device, f'only {count} CUDA device(s) are visible'))
    props = check_cuda(cudart, cudart.cudaGetDeviceProperties(index), 'cudaGetDeviceProperties')
    name = props.name
    name = name.decode(errors='replace') if isinstance(name, (bytes, bytearray)) else str(name)
    return GpuInfo(index, name.split('\x00')[0].strip(), f'{props.major}.{props.minor}')


_NUMPY_TYPES = {
    'FLOAT': np.float32,
    'HALF': np.float16,
    'INT32': np.int32,
    'INT64': np.int64,
    'INT8': np.int8,
    'UINT8': np.uint8,
    'BOOL': np.bool_,
}


def numpy_dtype(trt, data_type) -> np.dtype:
    """`trt.nptype`, with a table by name for TensorRT releases whose nptype lacks a type (INT64 is new in 10)."""
    try:
        return np.dtype(trt.nptype(data_type))
    except (TypeError, KeyError, ValueError):
        name = str(getattr(data_type, 'name', data_type)).rsplit('.', 1)[-1].upper()
        if name not in _NUMPY_TYPES:
            raise EngineBuildError(
                f'the engine has a tensor of type {data_type}, which has no numpy equivalent'
            ) from None
        return np.dtype(_NUMPY_TYPES[name])


def make_trt_logger(trt):
    """A TensorRT logger that forwards to `logging` and keeps the errors, so failures can quote them."""
    levels = {
        int(trt.ILogger.Severity.INTERNAL_ERROR): logging.ERROR,
        int(trt.ILogger.Severity.ERROR): logging.ERROR,
        int(trt.ILogger.Severity.WARNING): logging.WARNING,
        int(trt.ILogger.Severity.INFO): logging.DEBUG,
        int(trt.ILogger.Severity.VERBOSE): logging.DEBUG,
    }

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            level = levels.get(int(severity), logging.DEBUG)
            if level >= logging.ERROR:
                self.errors.append(str(msg))
            logger.log(level, 'TensorRT: %s', msg)

    return _Logger()


def _load_timing_cache(config, timing_file: Path):
    """The saved timing cache, or an empty one when there is none or TensorRT rejects it (only build time is lost)."""
    data = timing_file.read_bytes() if timing_file.is_file() else b''
    try:
        cache = config.create_timing_cache(data)
    except Exception as e:  # a corrupt file: TensorRT may raise or return None
        logger.warning('TensorRT rejected the timing cache %s (%s)', timing_file, e)
        cache = None
    if cache is None and data:
        logger.warning('starting an empty timing cache instead of %s', timing_file)
        cache = config.create_timing_cache(b'')
    if cache is not None and not config.set_timing_cache(cache, False):
        logger.warning('TensorRT did not accept the timing cache %s; building without it', timing_file)
        return None
    return cache


def build_engine(trt, trt_logger, tower: str, onnx_file: Path, profiles, precision: str, timing_file: Path) -> bytes:
    """Parse the ONNX graph and build a serialized engine with one optimisation profile over `profiles`."""
    trt_logger.errors.clear()
    builder = trt.Builder(trt_logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(onnx_file)):  # from the file, so external weight data is found
        errors = [describe_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(build_failure_message(tower, onnx_file, 'parsing', errors + trt_logger.errors))
    config = builder.create_builder_config()
    if precision == 'fp16':
        config.set_flag(trt.BuilderFlag.FP16)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    graph_inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    by_name = {p.name: p for p in profiles}
    unknown = sorted(graph_inputs - set(by_name))
    if unknown:
        raise EngineBuildError(
            build_failure_message(
                tower, onnx_file, 'configuring', [f'graph inputs without a shape profile: {", ".join(unknown)}']
            )
        )
    profile = builder.create_optimization_profile()
    for name in sorted(graph_inputs):
        p = by_name[name]
        profile.set_shape(name, p.min, p.opt, p.max)
    config.add_optimization_profile(profile)
    timing = _load_timing_cache(config, timing_file)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(build_failure_message(tower, onnx_file, 'building', trt_logger.errors))
    if timing is not None:
        atomic_write(timing_file, bytes(timing.serialize()))
    return bytes(serialized)


class TowerRunner:
    """One engine with its execution context, a CUDA stream and device buffers sized for the profile's maximum."""

    def __init__(self, trt, cudart, engine, device_index: int):
        self.trt, self.cudart, self.engine, self.device_index = trt, cudart, engine, device_index
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineBuildError('TensorRT could not create an execution context (out of GPU memory?)')
        self.stream = check_cuda(cudart, cudart.cudaStreamCreate(), 'cudaStreamCreate')
        self.inputs: list[tuple[str, np.dtype, int]] = []
        self.outputs: list[tuple[str, np.dtype, int]] = []
        try:
            self._allocate()
        except Exception:
            self.close()
            raise

    def _allocate(self) -> None:
        trt, cudart, engine = self.trt, self.cudart, self.engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        for name in input_names:  # the largest shapes, so the output shapes below are the largest too
            self.context.set_input_shape(name, tuple(engine.get_tensor_profile_shape(name, 0)[2]))
        for name in names:
            dtype = numpy_dtype(trt, engine.get_tensor_dtype(name))
            shape = tuple(self.context.get_tensor_shape(name))
            pointer = check_cuda(cudart, cudart.cudaMalloc(max(1, int(np.prod(shape)) * dtype.itemsize)), 'cudaMalloc')
            (self.inputs if name in input_names else self.outputs).append((name, dtype, pointer))
            self.context.set_tensor_address(name, int(pointer))
        if not self.outputs:
            raise EngineBuildError('the TensorRT engine has no output tensor')

    def input_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.engine.get_tensor_shape(name))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Copy in, execute on the stream, copy the first output out; float32 numpy like every backend."""
        cudart = self.cudart
        check_cuda(cudart, cudart.cudaSetDevice(self.device_index), 'cudaSetDevice')  # current device is per thread
        kept = []
        for name, dtype, pointer in self.inputs:
            array = np.ascontiguousarray(feeds[name], dtype=dtype)
            if not self.context.set_input_shape(name, array.shape):
                raise ValueError(
                    f"input {name} of shape {array.shape} is outside the engine's profile "
                    f'{tuple(tuple(s) for s in self.engine.get_tensor_profile_shape(name, 0))}'
                )
            check_cuda(
                cudart,
                cudart.cudaMemcpyAsync(
                    pointer, array.ctypes.data, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream
                ),
                'cudaMemcpyAsync (to the GPU)',
            )
            kept.append(array)  # alive until the stream is synchronised
        name, dtype, pointer = self.outputs[0]
        out = np.empty(tuple(self.context.get_tensor_shape(name)), dtype=dtype)
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeError('TensorRT execute_async_v3 failed; see the TensorRT messages in the log')
        check_cuda(
            cudart,
            cudart.cudaMemcpyAsync(
                out.ctypes.data, pointer, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream
            ),
            'cudaMemcpyAsync (from the GPU)',
        )
        check_cuda(cudart, cudart.cudaStreamSynchronize(self.stream), 'cudaStreamSynchronize')
        return out.astype(np.float32, copy=False)

    def close(self) -> None:
        for _, _, pointer in self.inputs + self.outputs:
            self.cudart.cudaFree(pointer)
        self.inputs, self.outputs = [], []
        if self.stream is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None
