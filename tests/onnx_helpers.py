"""Helpers for ONNX tests: sessions of graphs held in memory, inputs for the tiny towers, and a directory arranged
like clip-as-service's published models."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from clipserve.backends.onnx import fused
from clipserve.models.tokenizer import Tokenizer

TEXTS = ['a photo of a dog', 'a much longer caption about a dog on a red chair in a garden', '!']


def plain_session(graph, folder=None) -> ort.InferenceSession:
    """A plain CPU session of `graph` (a path or bytes); `folder` holds the external weights of a graph in bytes."""
    options = ort.SessionOptions()
    if folder is not None:
        options.add_session_config_entry(fused.EXTERNAL_DATA_FOLDER, str(folder))
    return ort.InferenceSession(graph, options, providers=['CPUExecutionProvider'])


def tower_feeds(tower: str, rows: int) -> dict:
    """Seeded pixels for visual.onnx; for textual.onnx the first `rows` of TEXTS, of different lengths."""
    if tower == 'visual.onnx':
        return {'pixel_values': np.random.default_rng(rows).normal(size=(rows, 3, 224, 224)).astype(np.float32)}
    tokens = Tokenizer()(TEXTS[:rows])
    return {'input_ids': tokens.input_ids.astype(np.int64), 'attention_mask': tokens.attention_mask.astype(np.int64)}


def make_clip_as_service_layout(exported: Path, target: Path) -> Path:
    """Copy our export and make it look like clip-as-service's: self-contained files (weights inline),
    int32 text inputs of fixed length 77, no clipserve.json."""
    target.mkdir(parents=True, exist_ok=True)
    onnx.save_model(onnx.load(str(exported / 'visual.onnx')), str(target / 'visual.onnx'))
    graph_model = onnx.load(str(exported / 'textual.onnx'))
    graph = graph_model.graph
    casts = []
    for graph_input in graph.input:
        original = graph_input.name
        renamed = f'{original}_int64'
        for node in graph.node:
            node.input[:] = [renamed if name == original else name for name in node.input]
        casts.append(helper.make_node('Cast', [original], [renamed], to=TensorProto.INT64))
        graph_input.type.tensor_type.elem_type = TensorProto.INT32
        dims = graph_input.type.tensor_type.shape.dim
        dims[1].ClearField('dim_param')
        dims[1].dim_value = 77
    for cast in reversed(casts):
        graph.node.insert(0, cast)
    onnx.save_model(graph_model, str(target / 'textual.onnx'))
    return target
