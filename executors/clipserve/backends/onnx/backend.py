"""ONNX Runtime backend. Imports neither torch nor open_clip: an install with only the `onnx` extra serves.

It loads a directory with `visual.onnx` and `textual.onnx`: one written by clipserve's exporter
(with `clipserve.json`), or one in clip-as-service's published layout (same file and input names;
what clipserve.json would say is then inferred from the graphs and clip-as-service's conventions).
Given a model name instead, it exports the model once, in a separate process (which needs the
`torch` extra), into the cache, and loads it from there afterwards.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from clipserve.backends.base import Backend, BackendOptions
from clipserve.backends.devices import parse_device
from clipserve.backends.export_format import (
    TEXTUAL_FILE,
    VISUAL_FILE,
    ExportMetadata,
    clip_as_service_metadata,
    export_tokenizer,
    has_metadata,
    locate_export,
    read_metadata,
)
from clipserve.backends.int8_check import verify_int8
from clipserve.backends.onnx.fp16 import fp16_copy
from clipserve.backends.onnx.fused import cpu_session
from clipserve.backends.onnx.int8 import int8_copy
from clipserve.backends.precision import resolve_precision
from clipserve.errors import BackendUnavailableError

_NP_TYPES = {
    'tensor(int32)': np.int32,
    'tensor(int64)': np.int64,
    'tensor(float)': np.float32,
    'tensor(float16)': np.float16,
}

logger = logging.getLogger(__name__)


def _static(dim) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _providers(device: str) -> list:
    if device == 'cpu':
        return ['CPUExecutionProvider']
    return [('CUDAExecutionProvider', {'device_id': int(device.partition(':')[2] or 0)}), 'CPUExecutionProvider']


class OnnxBackend(Backend):
    name = 'onnx'

    def __init__(self, model: str | None, options: BackendOptions = BackendOptions(), model_path: str | None = None):
        super().__init__()
        self.device = self._pick_device(options.device)
        self.precision = resolve_precision('onnx', self.device, options.dtype)
        self.dtype = self.precision.name
        folder = locate_export(model, model_path, options.trust_remote_code, options.truncate_dim)
        self.folder = folder
        self._num_threads = options.num_threads
        self.visual = self._session(folder / VISUAL_FILE)
        self.textual = self._session(folder / TEXTUAL_FILE)
        metadata = self._metadata(folder, model)
        self.model_name = metadata.model
        text_shape = self.textual.get_inputs()[0].shape
        self._text_inputs = {i.name: _NP_TYPES.get(i.type, np.int64) for i in self.textual.get_inputs()}
        self._text_length = _static(text_shape[1]) if len(text_shape) > 1 else None
        self._pixel_type = _NP_TYPES.get(self.visual.get_inputs()[0].type, np.float32)
        self.trims_padding = self._text_length is None  # a graph with a static length takes exactly that
        self.context_length = self._text_length or metadata.context_length
        self.pad_id = metadata.pad_id
        self.tokenizer = export_tokenizer(folder, metadata)
        self.sigmoid_logits = tuple(metadata.sigmoid_logits) if metadata.sigmoid_logits else None
        self.embed_dim = metadata.embed_dim or self._probe_dim(metadata.image_size)
        self.preprocess = metadata.preprocess_config()
        if self.dtype == 'int8':
            fp32 = OnnxBackend(None, dataclasses.replace(options, dtype='fp32'), model_path=str(folder))
            verify_int8(self, fp32)

    # ---- set-up ---------------------------------------------------------------------------

    @staticmethod
    def _pick_device(device: str | None) -> str:
        available = ort.get_available_providers()
        parsed = parse_device(device, 'onnx')
        if parsed.kind is None:
            return 'cuda' if 'CUDAExecutionProvider' in available else 'cpu'
        if parsed.kind == 'cuda' and 'CUDAExecutionProvider' not in available:
            raise BackendUnavailableError(
                f'device {device!r} was asked for, but this onnxruntime ({ort.__version__}) has no CUDA provider '
                f'(available: {", ".join(available)}). Install the onnx-gpu extra (onnxruntime-gpu, never together '
                'with onnxruntime), or use device "cpu".'
            )
        return str(parsed)

    def _metadata(self, folder: Path, model: str | None) -> ExportMetadata:
        if has_metadata(folder):
            return read_metadata(folder)
        return clip_as_service_metadata(
            model,
            folder,
            _static(self.visual.get_inputs()[0].shape[-1]),
            _static(self.visual.get_outputs()[0].shape[-1]),
        )

    def _options(self) -> ort.SessionOptions:
        """A session's options (each session has its own intra-op threads)."""
        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.inter_op_num_threads = 1
        if self.device == 'cpu':
            # With dynamic batch and sequence sizes, ORT's arena and per-shape memory patterns keep
            # the largest activations of every shape seen; plain allocation measured no slower
            # and gives the memory back after each call.
            session_options.enable_cpu_mem_arena = False
            session_options.enable_mem_pattern = False
            # Threads spin within a pass (fast between its operators) but stop when it returns: otherwise the
            # text session's threads, spinning after a query's short pass, would be extra threads on the next
            # image pass's cores, and both sessions' on the decoding between passes (docs/benchmarks.md, Overload).
            session_options.add_session_config_entry('session.force_spinning_stop', '1')
        if self._num_threads:
            session_options.intra_op_num_threads = self._num_threads
        return session_options

    def _session(self, path: Path) -> ort.InferenceSession:
        if self.dtype == 'fp16':
            path = fp16_copy(path)
        elif self.dtype == 'int8':
            path = int8_copy(path)
        elif self.device == 'cpu':
            return cpu_session(path, self._options)  # float32: attention fused where recognised
        try:
            session = ort.InferenceSession(str(path), self._options(), providers=_providers(self.device))
        except Exception as e:
            if self.device == 'cpu':
                raise
            # e.g. cuda:7 on a machine with fewer GPUs: CUDA's "invalid device ordinal"
            raise BackendUnavailableError(
                f'onnxruntime could not start {path.name} on device {self.device!r}: {e}. Check the device index '
                '(CUDA_VISIBLE_DEVICES orders them from 0) and that the CUDA and cuDNN versions match onnxruntime-gpu'
            ) from e
        if self.device.startswith('cuda') and session.get_providers()[0] != 'CUDAExecutionProvider':
            # onnxruntime silently falls back to the CPU when CUDA/cuDNN libraries do not load
            raise BackendUnavailableError(
                f'onnxruntime could not start its CUDA provider for {path.name} (it fell back to {session.get_providers()}); '
                'check that the CUDA and cuDNN versions match onnxruntime-gpu, or use device "cpu"'
            )
        return session

    def _probe_dim(self, image_size: int) -> int:
        zeros = np.zeros((1, 3, image_size, image_size), dtype=self._pixel_type)
        return int(self.visual.run(None, {self.visual.get_inputs()[0].name: zeros})[0].shape[-1])

    # ---- inference ------------------------------------------------------------------------

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        name = self.visual.get_inputs()[0].name
        return self.visual.run(None, {name: pixels.astype(self._pixel_type, copy=False)})[0]

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {}
        for name, np_type in self._text_inputs.items():
            feeds[name] = (attention_mask if 'mask' in name else input_ids).astype(np_type, copy=False)
        return self.textual.run(None, feeds)[0]
