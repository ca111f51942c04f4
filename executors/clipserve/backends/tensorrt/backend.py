"""TensorRT backend: engines built from clipserve's own ONNX export, cached per GPU, TensorRT version and settings.

TensorRT (10 or newer) and cuda-python, the `tensorrt` extra, are imported only when a TensorRTBackend
is created, so this module imports without them. What to build
(tensorrt_profiles.py) and whether a cached engine may be loaded (tensorrt_cache.py) is plain Python
and unit-tested without a GPU; TensorRT and CUDA themselves are touched only in tensorrt_runtime.py
and the constructor here.

CUDA memory and streams come from cuda-python's runtime bindings (`cuda.bindings.runtime`, or the
older `cuda.cudart`), never from torch, so a TensorRT install serves without PyTorch.

Written to the TensorRT 10 Python API documentation (named I/O tensors, `execute_async_v3`); see the
README for where it has and has not been run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clipserve.backends.base import Backend, BackendOptions
from clipserve.backends.export_format import (
    GRAPH_FILES,
    METADATA_FILE,
    export_tokenizer,
    locate_export,
    read_metadata,
    require_fixed_size,
)
from clipserve.backends.precision import resolve_precision
from clipserve.backends.tensorrt.cache import (
    EngineKey,
    engine_path,
    load_or_build,
    onnx_sha256,
    timing_cache_path,
)
from clipserve.backends.tensorrt.profiles import (
    check_max_batch,
    image_profiles,
    parse_cuda_device,
    profile_signature,
    text_profiles,
)
from clipserve.backends.tensorrt.runtime import (
    TowerRunner,
    build_engine,
    check_cuda,
    cuda_device,
    import_cudart,
    import_tensorrt,
    make_trt_logger,
)

TOWERS = ('visual', 'textual')


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
        self._runners: list[TowerRunner] = []
        # Cheap checks first: a missing install or GPU must fail before minutes of export or build.
        index = parse_cuda_device(options.device)
        trt = import_tensorrt()
        cudart = import_cudart()
        self.precision = resolve_precision('tensorrt', 'cuda', options.dtype)
        self.dtype = self.precision.name
        self.gpu = cuda_device(cudart, index, str(options.device or 'cuda'))
        self.device = f'cuda:{index}'
        folder = locate_export(
            model, model_path, options.trust_remote_code, options.truncate_dim, (*GRAPH_FILES, METADATA_FILE)
        )
        metadata = read_metadata(folder)
        require_fixed_size(metadata, 'tensorrt')
        self.folder = folder
        self.model_name = metadata.model
        self.context_length = int(metadata.context_length)
        self.pad_id = int(metadata.pad_id)
        self.tokenizer = export_tokenizer(folder, metadata)
        self.sigmoid_logits = tuple(metadata.sigmoid_logits) if metadata.sigmoid_logits else None
        self.preprocess = metadata.preprocess_config()
        dynamic = bool(metadata.dynamic_sequence)
        check_cuda(cudart, cudart.cudaSetDevice(index), 'cudaSetDevice')
        self._trt_logger = make_trt_logger(trt)
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
                lambda t=tower, f=onnx_file: build_engine(
                    trt, self._trt_logger, t, f, profiles[t], self.dtype, timing_file
                ),
            )
        try:
            self.visual = TowerRunner(trt, cudart, engines['visual'], index)
            self._runners.append(self.visual)
            self.textual = TowerRunner(trt, cudart, engines['textual'], index)
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

    # The base class pads (or trims) the texts and cuts batches to `max_batch`, the engines' profile.

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        return self.visual.run({self.visual.inputs[0][0]: pixels})

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.textual.run({name: (attention_mask if 'mask' in name else input_ids) for name in self._text_inputs})

    def describe(self) -> str:
        return (
            f'{self.model_name} on tensorrt ({self.gpu.name}, sm {self.gpu.compute_capability}, {self.dtype}, '
            f'batch 1..{self.max_batch}, dim {self.embed_dim})'
        )
