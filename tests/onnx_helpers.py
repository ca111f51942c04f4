"""Helpers for ONNX tests: a directory arranged like clip-as-service's published models."""

from pathlib import Path

import onnx
from onnx import TensorProto, helper


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
