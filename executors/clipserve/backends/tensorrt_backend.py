"""TensorRT backend: engines built from clipserve's own ONNX export, cached per GPU, TensorRT version and settings.

TensorRT (10 or newer) and cuda-python, the `tensorrt` extra, are imported only when a TensorRTBackend
is created, so this module imports without them. Everything that decides *what* to build and *whether
a cached engine may be loaded* (profiles, cache keys, paths, staleness, error messages) is plain Python
and unit-tested without a GPU; only `_build_engine`, `_TowerRunner` and the constructor touch TensorRT.

CUDA memory and streams come from cuda-python's runtime bindings (`cuda.bindings.runtime`, or the
older `cuda.cudart`), never from torch, so a TensorRT install serves without PyTorch.

Written to the TensorRT 10 Python API documentation (named I/O tensors, `execute_async_v3`); see the
README for where it has and has not been run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from clipserve.backends.base import Backend, BackendOptions
from clipserve.backends.devices import parse_device
from clipserve.backends.export_format import GRAPH_FILES, METADATA_FILE, cached_export, missing_files, read_metadata
from clipserve.backends.precision import resolve_dtype
from clipserve.errors import BackendUnavailableError, EngineBuildError, InvalidParameterError, WeightsUnavailableError
from clipserve.models.cache import cache_dir

INSTALL_COMMAND = 'pip install "clipserve[tensorrt]"'
MIN_TENSORRT_MAJOR = 10  # the named-tensor API and execute_async_v3
MAX_TENSORRT_MAJOR = 10  # TensorRT 11 removed BuilderFlag.FP16, which the fp16 engines are built with
ENGINE_FORMAT = 1  # bump when what goes into an engine changes (builder flags, profiles), so caches rebuild
OPT_TEXT_LENGTH = 16  # TensorRT tunes kernels for the opt shape; real queries are 10-20 tokens
TOWERS = ('visual', 'textual')

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


# ---- options ----------------------------------------------------------------------------------


def parse_cuda_device(device: str | None) -> int:
    """The CUDA device index for `device`; `None` means the first GPU. There is no CPU path."""
    parsed = parse_device(device, 'tensorrt')
    if parsed.kind == 'cpu':
        raise BackendUnavailableError(
            'the tensorrt backend runs on NVIDIA GPUs only; for the CPU choose backend "onnx" or "torch"'
        )
    return parsed.index or 0


def pick_precision(dtype: str | None) -> str:
    """fp16 unless asked otherwise: it is why one uses TensorRT. fp32 disables TF32 too, so it means fp32."""
    return resolve_dtype('tensorrt', 'cuda', dtype)


def check_max_batch(max_batch) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise InvalidParameterError(f'max_batch must be a positive integer, got {max_batch!r}')
    return max_batch


# ---- optimisation profiles --------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeProfile:
    """The min/opt/max shapes TensorRT builds one input for; any shape in between runs without a rebuild."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def image_profiles(max_batch: int, image_size: int, name: str = 'pixel_values') -> tuple[ShapeProfile, ...]:
    """Batch 1..max_batch of S x S RGB; tuned for full minibatches, the throughput case."""
    max_batch = check_max_batch(max_batch)
    shape = (3, image_size, image_size)
    return (ShapeProfile(name, (1, *shape), (max_batch, *shape), (max_batch, *shape)),)


def text_profiles(
    max_batch: int,
    context_length: int,
    dynamic_sequence: bool,
    names: tuple[str, ...] = ('input_ids', 'attention_mask'),
) -> tuple[ShapeProfile, ...]:
    """Batch 1..max_batch, and length 1..context when the export lets the base class trim padding.

    Every text input gets the same profile: ids and mask always share their shape.
    """
    max_batch = check_max_batch(max_batch)
    if dynamic_sequence:
        lengths = (1, min(context_length, OPT_TEXT_LENGTH), context_length)
    else:
        lengths = (context_length,) * 3
    return tuple(
        ShapeProfile(name, (1, lengths[0]), (max_batch, lengths[1]), (max_batch, lengths[2])) for name in names
    )


def profile_signature(profiles) -> str:
    """A canonical text form of the profiles, for the cache key: order of inputs does not matter."""

    def dims(shape):
        return 'x'.join(str(d) for d in shape)

    return ';'.join(
        f'{p.name}={dims(p.min)}/{dims(p.opt)}/{dims(p.max)}' for p in sorted(profiles, key=lambda p: p.name)
    )


# ---- cache keys and paths ---------------------------------------------------------------------


def onnx_sha256(onnx_file: Path) -> str:
    """sha256 over the graph and its external-data file, if any: the engine depends on both."""
    digest = hashlib.sha256()
    for part in (onnx_file, onnx_file.with_name(onnx_file.name + '.data')):
        if part.is_file():
            digest.update(part.name.encode() + b'\0')
            with open(part, 'rb') as f:
                for chunk in iter(lambda: f.read(1 << 20), b''):
                    digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class EngineKey:
    """Everything a serialized engine depends on. An engine built under another key must not be loaded:
    engines are specific to the TensorRT version and the GPU model, and cannot run other shapes."""

    tower: str
    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    precision: str
    profile: str
    engine_format: int = ENGINE_FORMAT

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()


def engine_cache_dir() -> Path:
    return cache_dir() / 'tensorrt'


def engine_path(key: EngineKey, root: Path | None = None) -> Path:
    """One file per key: different GPUs or TensorRT versions sharing a cache never overwrite each other."""
    return (root or engine_cache_dir()) / f'{key.tower}-{key.precision}-{key.digest()[:20]}.engine'


def sidecar_path(engine_file: Path) -> Path:
    return engine_file.with_suffix('.json')


def timing_cache_path(tensorrt_version: str, gpu_name: str, compute_capability: str, root: Path | None = None) -> Path:
    """Timing caches are valid for one GPU model and TensorRT version (not per model or precision)."""
    slug = re.sub(r'[^A-Za-z0-9._-]+', '-', f'{gpu_name}-sm{compute_capability}-trt{tensorrt_version}').strip('-')
    return (root or engine_cache_dir()) / f'timing-{slug}.cache'


# ---- engine files -----------------------------------------------------------------------------


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write beside the target and rename, so a crash or a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_engine(engine_file: Path, key: EngineKey, blob: bytes) -> None:
    """Save the engine, then its sidecar; a crash between the two leaves a mismatch, i.e. a rebuild."""
    _atomic_write(engine_file, blob)
    sidecar = {'key': key.as_dict(), 'engine_bytes': len(blob), 'engine_sha256': hashlib.sha256(blob).hexdigest()}
    _atomic_write(sidecar_path(engine_file), json.dumps(sidecar, indent=2).encode())


def stale_reason(engine_file: Path, key: EngineKey) -> str | None:
    """Why the cached engine must be rebuilt instead of loaded, or None when it may be loaded.

    TensorRT can crash or misbehave on engines from another version or GPU, so the sidecar's key and
    the file's size and hash are checked before TensorRT ever sees the bytes.
    """
    if not engine_file.is_file():
        return 'no cached engine'
    sidecar = sidecar_path(engine_file)
    if not sidecar.is_file():
        return f'{sidecar.name} is missing'
    try:
        recorded = json.loads(sidecar.read_text())
        recorded_key = recorded['key']
        size, sha = int(recorded['engine_bytes']), str(recorded['engine_sha256'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f'{sidecar.name} is unreadable ({type(e).__name__}: {e})'
    wanted = key.as_dict()
    differing = [f.name for f in fields(EngineKey) if recorded_key.get(f.name) != wanted[f.name]]
    if differing:
        return 'it was built for another ' + ', '.join(
            f'{name} ({recorded_key.get(name)!r}, now {wanted[name]!r})' for name in differing
        )
    actual = engine_file.stat().st_size
    if actual != size:
        return f'the engine file has {actual} bytes, its sidecar says {size} (truncated or replaced)'
    if _file_sha256(engine_file) != sha:
        return 'the engine file does not match the sha256 in its sidecar (corrupt or replaced)'
    return None


@contextlib.contextmanager
def _build_lock(engine_file: Path):
    """Replicas on one machine share the cache: only one of them builds an engine, the others then load it."""
    engine_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent builds are wasteful but safe (atomic renames)
        yield
        return
    with open(engine_file.with_suffix('.lock'), 'a') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_or_build(engine_file: Path, key: EngineKey, deserialize, build):
    """The cached engine when it is fresh and TensorRT accepts it; otherwise a new build, saved for next time.

    `deserialize(bytes)` returns an engine or None (TensorRT's convention) and may raise; `build()`
    returns the serialized engine. Returns (engine, why it was built, or None when loaded from the cache).
    """
    with _build_lock(engine_file):
        reason = stale_reason(engine_file, key)
        if reason is None:
            try:
                engine = deserialize(engine_file.read_bytes())
            except Exception as e:  # TensorRT raises on some corrupt plans and returns None on others
                engine, reason = None, f'TensorRT could not deserialize it ({e})'
            if engine is not None:
                logger.info('loaded the cached %s engine %s', key.tower, engine_file)
                return engine, None
            reason = reason or 'TensorRT could not deserialize it'
        logger.warning(
            'building the %s TensorRT engine (%s); this takes minutes once, later starts load %s',
            key.tower,
            reason,
            engine_file,
        )
        blob = build()
        write_engine(engine_file, key, blob)
    engine = deserialize(blob)
    if engine is None:
        raise EngineBuildError(f'TensorRT built the {key.tower} engine but could not deserialize it ({engine_file})')
    return engine, reason


# ---- the export TensorRT builds from ------------------------------------------------------------


def locate_export(model: str | None, model_path: str | None) -> Path:
    """The directory of clipserve's ONNX export: `model_path`, else the export cache (exporting on first use)."""
    if model_path:
        folder = Path(model_path).expanduser()
        missing = missing_files(folder, (*GRAPH_FILES, METADATA_FILE))
        if missing:
            raise WeightsUnavailableError(
                f'the tensorrt backend builds from a clipserve ONNX export; {str(folder)!r} lacks '
                f'{", ".join(missing)}. Write one with `python -m clipserve export onnx NAME DIR` and pass model_path=DIR.'
            )
        return folder
    return cached_export(model)


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


def _cuda(cudart, result, what: str):
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
    props = _cuda(cudart, cudart.cudaGetDeviceProperties(index), 'cudaGetDeviceProperties')
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


def _numpy_dtype(trt, data_type) -> np.dtype:
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


def _make_trt_logger(trt):
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


def _build_engine(trt, trt_logger, tower: str, onnx_file: Path, profiles, precision: str, timing_file: Path) -> bytes:
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
        _atomic_write(timing_file, bytes(timing.serialize()))
    return bytes(serialized)


class _TowerRunner:
    """One engine with its execution context, a CUDA stream and device buffers sized for the profile's maximum."""

    def __init__(self, trt, cudart, engine, device_index: int):
        self.trt, self.cudart, self.engine, self.device_index = trt, cudart, engine, device_index
        self.context = engine.create_execution_context()
        if self.context is None:
            raise EngineBuildError('TensorRT could not create an execution context (out of GPU memory?)')
        self.stream = _cuda(cudart, cudart.cudaStreamCreate(), 'cudaStreamCreate')
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
            dtype = _numpy_dtype(trt, engine.get_tensor_dtype(name))
            shape = tuple(self.context.get_tensor_shape(name))
            pointer = _cuda(cudart, cudart.cudaMalloc(max(1, int(np.prod(shape)) * dtype.itemsize)), 'cudaMalloc')
            (self.inputs if name in input_names else self.outputs).append((name, dtype, pointer))
            self.context.set_tensor_address(name, int(pointer))
        if not self.outputs:
            raise EngineBuildError('the TensorRT engine has no output tensor')

    def input_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.engine.get_tensor_shape(name))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Copy in, execute on the stream, copy the first output out; float32 numpy like every backend."""
        cudart = self.cudart
        _cuda(cudart, cudart.cudaSetDevice(self.device_index), 'cudaSetDevice')  # current device is per thread
        kept = []
        for name, dtype, pointer in self.inputs:
            array = np.ascontiguousarray(feeds[name], dtype=dtype)
            if not self.context.set_input_shape(name, array.shape):
                raise ValueError(
                    f"input {name} of shape {array.shape} is outside the engine's profile "
                    f'{tuple(tuple(s) for s in self.engine.get_tensor_profile_shape(name, 0))}'
                )
            _cuda(
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
        _cuda(
            cudart,
            cudart.cudaMemcpyAsync(
                out.ctypes.data, pointer, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream
            ),
            'cudaMemcpyAsync (from the GPU)',
        )
        _cuda(cudart, cudart.cudaStreamSynchronize(self.stream), 'cudaStreamSynchronize')
        return out.astype(np.float32, copy=False)

    def close(self) -> None:
        for _, _, pointer in self.inputs + self.outputs:
            self.cudart.cudaFree(pointer)
        self.inputs, self.outputs = [], []
        if self.stream is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None


class TensorRTBackend(Backend):
    """CLIP on TensorRT engines built from clipserve's ONNX export; fp16 by default, on one CUDA device.

    `max_batch` is the largest batch the engines are built for (pass the executor's minibatch_size);
    larger inputs run in chunks of `max_batch`.
    """

    name = 'tensorrt'

    def __init__(
        self,
        model: str | None,
        options: BackendOptions = BackendOptions(),
        model_path: str | None = None,
        max_batch: int = 32,
    ):
        super().__init__()
        self.max_batch = check_max_batch(max_batch)
        self._runners: list[_TowerRunner] = []
        # Cheap checks first: a missing install or GPU must fail before minutes of export or build.
        index = parse_cuda_device(options.device)
        trt = import_tensorrt()
        cudart = import_cudart()
        self.dtype = pick_precision(options.dtype)
        self.gpu = cuda_device(cudart, index, str(options.device or 'cuda'))
        self.device = f'cuda:{index}'
        folder = locate_export(model, model_path)
        metadata = read_metadata(folder)
        self.folder = folder
        self.model_name = metadata.model
        self.context_length = int(metadata.context_length)
        self.preprocess = metadata.preprocess_config()
        dynamic = bool(metadata.dynamic_sequence)
        _cuda(cudart, cudart.cudaSetDevice(index), 'cudaSetDevice')
        self._trt_logger = _make_trt_logger(trt)
        self._runtime = trt.Runtime(self._trt_logger)  # must outlive the engines it deserialized
        profiles = {
            'visual': image_profiles(self.max_batch, self.preprocess.image_size),
            'textual': text_profiles(self.max_batch, self.context_length, dynamic),
        }
        timing_file = timing_cache_path(trt.__version__, self.gpu.name, self.gpu.compute_capability)
        self.engine_files: dict[str, Path] = {}
        self.built: dict[str, str | None] = {}  # tower -> why it was built at this start; None = loaded from cache
        engines = {}
        for tower in TOWERS:
            onnx_file = folder / f'{tower}.onnx'
            key = EngineKey(
                tower=tower,
                onnx_sha256=onnx_sha256(onnx_file),
                tensorrt_version=trt.__version__,
                gpu_name=self.gpu.name,
                compute_capability=self.gpu.compute_capability,
                precision=self.dtype,
                profile=profile_signature(profiles[tower]),
            )
            self.engine_files[tower] = engine_path(key)
            engines[tower], self.built[tower] = load_or_build(
                self.engine_files[tower],
                key,
                self._runtime.deserialize_cuda_engine,
                lambda t=tower, f=onnx_file: _build_engine(
                    trt, self._trt_logger, t, f, profiles[t], self.dtype, timing_file
                ),
            )
        try:
            self.visual = _TowerRunner(trt, cudart, engines['visual'], index)
            self._runners.append(self.visual)
            self.textual = _TowerRunner(trt, cudart, engines['textual'], index)
            self._runners.append(self.textual)
        except Exception:
            self.close()
            raise
        self._text_inputs = [name for name, _, _ in self.textual.inputs]
        ids_name = next((n for n in self._text_inputs if 'mask' not in n), self._text_inputs[0])
        self.trims_padding = dynamic and self.textual.input_shape(ids_name)[1] == -1
        self.embed_dim = int(metadata.embed_dim or self.visual.engine.get_tensor_shape(self.visual.outputs[0][0])[-1])

    def close(self) -> None:
        """Free device buffers and streams now rather than at interpreter exit."""
        for runner in self._runners:
            runner.close()
        self._runners = []

    # ---- inference ------------------------------------------------------------------------

    def _chunks(self, n: int):
        return [(start, min(n, start + self.max_batch)) for start in range(0, n, self.max_batch)]

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        name = self.visual.inputs[0][0]
        return np.concatenate([self.visual.run({name: pixels[a:b]}) for a, b in self._chunks(len(pixels))])

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if not self.trims_padding and input_ids.shape[1] != self.context_length:
            pad = self.context_length - input_ids.shape[1]
            input_ids = np.pad(input_ids, ((0, 0), (0, pad)))[:, : self.context_length]
            attention_mask = np.pad(attention_mask, ((0, 0), (0, pad)))[:, : self.context_length]
        outs = []
        for a, b in self._chunks(len(input_ids)):
            feeds = {name: (attention_mask if 'mask' in name else input_ids)[a:b] for name in self._text_inputs}
            outs.append(self.textual.run(feeds))
        return np.concatenate(outs)

    def describe(self) -> str:
        return (
            f'{self.model_name} on tensorrt ({self.gpu.name}, sm {self.gpu.compute_capability}, {self.dtype}, '
            f'batch 1..{self.max_batch}, dim {self.embed_dim})'
        )
