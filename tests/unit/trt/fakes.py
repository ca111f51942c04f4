"""Stand-ins for TensorRT and cuda-python (`FakeTRT`, `FakeCudart`) that follow the TensorRT 10 Python API the
backend calls and run the ONNX graphs in onnxruntime. They prove the plumbing (shapes, buffers, copies,
caching, errors), not TensorRT's numerics."""

import enum
import json
import types

import numpy as np


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
