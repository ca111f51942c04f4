"""OpenVINO backend: the ONNX exports the onnx backend serves, on Intel's runtime, CPUs and Intel GPUs.

It imports neither torch nor onnxruntime: OpenVINO reads the ONNX graphs itself (no conversion step,
no file of its own), and is imported without its telemetry (openvino_runtime.py). The folder is found
as the onnx backend finds it: `model_path` (clipserve's export, or clip-as-service's layout), else the
cached export of the model name, made once in a separate process. The visual and textual towers are
compiled separately, each in the precision backends/precision.py resolved for it (openvino_compile.py
sets and checks it), with the batch and, where the export has it, the sequence length left dynamic.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from clipserve.backends.base import Backend, BackendOptions
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
from clipserve.backends.int8_check import require_int8_dot_products, verify_int8
from clipserve.backends.openvino.compile import compile_tower, pick_device, properties
from clipserve.backends.openvino.int8 import quantize_matmul_weights
from clipserve.backends.openvino.runtime import ov
from clipserve.backends.precision import resolve_precision
from clipserve.models.cache import cache_dir

logger = logging.getLogger(__name__)


def _static(dimension) -> int | None:
    return dimension.get_length() if dimension.is_static else None


class OpenVINOBackend(Backend):
    name = 'openvino'

    def __init__(self, model: str | None, options: BackendOptions = BackendOptions(), model_path: str | None = None):
        super().__init__()
        core = ov.Core()
        self.device = pick_device(core, options.device)
        self.precision = resolve_precision('openvino', self.device, options.dtype)
        self.dtype = self.precision.name
        if self.dtype == 'int8':
            require_int8_dot_products('openvino')
        self.folder = folder = locate_export(model, model_path, options.trust_remote_code, options.truncate_dim)
        visual, textual = core.read_model(str(folder / VISUAL_FILE)), core.read_model(str(folder / TEXTUAL_FILE))
        metadata = self._metadata(folder, model, visual)
        self._visual = self._compile(core, visual, 'visual.onnx', self.precision.images, options)
        self._textual = self._compile(core, textual, 'textual.onnx', self.precision.texts, options)
        self._visual_request = self._visual.create_infer_request()
        self._textual_request = self._textual.create_infer_request()
        self._pixel_input = self._visual.inputs[0]
        self._text_inputs = {i.get_any_name(): i.get_element_type().to_dtype() for i in self._textual.inputs}
        text_shape = self._textual.inputs[0].get_partial_shape()
        text_length = _static(text_shape[1]) if text_shape.rank.get_length() > 1 else None
        self.trims_padding = text_length is None  # a graph with a static length takes exactly that
        self.context_length = text_length or metadata.context_length
        self.model_name = metadata.model
        self.pad_id = metadata.pad_id
        self.tokenizer = export_tokenizer(folder, metadata)
        self.sigmoid_logits = tuple(metadata.sigmoid_logits) if metadata.sigmoid_logits else None
        self.preprocess = metadata.preprocess_config()
        self.embed_dim = metadata.embed_dim or self._probe_dim(metadata.image_size)
        if self.dtype == 'int8':
            fp32 = OpenVINOBackend(None, dataclasses.replace(options, dtype='fp32'), model_path=str(folder))
            verify_int8(self, fp32)

    def _compile(self, core: ov.Core, graph: ov.Model, tower: str, dtype: str, options: BackendOptions):
        if dtype == 'int8':
            count = quantize_matmul_weights(graph)
            logger.info(
                '%s: %d MatMul weights quantized to int8 (the first block and the last stay float)', tower, count
            )
        cache = str(cache_dir() / 'openvino') if self.device != 'cpu' else None
        config = properties(self.device, dtype, options.num_threads, cache)
        return compile_tower(core, graph, tower, self.device, dtype, config)

    @staticmethod
    def _metadata(folder: Path, model: str | None, visual: ov.Model) -> ExportMetadata:
        if has_metadata(folder):
            return read_metadata(folder)
        return clip_as_service_metadata(
            model,
            folder,
            _static(visual.inputs[0].get_partial_shape()[-1]),
            _static(visual.outputs[0].get_partial_shape()[-1]),
        )

    def _probe_dim(self, image_size: int) -> int:
        zeros = np.zeros((1, 3, image_size, image_size), dtype=np.float32)
        return int(self._encode_images(zeros).shape[-1])

    # ---- inference ------------------------------------------------------------------------

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        pixels = pixels.astype(self._pixel_input.get_element_type().to_dtype(), copy=False)
        return self._visual_request.infer({self._pixel_input.get_any_name(): pixels})[0]

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = {
            name: (attention_mask if 'mask' in name else input_ids).astype(np_type, copy=False)
            for name, np_type in self._text_inputs.items()
        }
        return self._textual_request.infer(feeds)[0]

    def close(self) -> None:
        self._visual_request = self._textual_request = self._visual = self._textual = None
