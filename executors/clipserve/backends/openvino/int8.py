"""int8 on the openvino backend (`dtype: int8`, CPUs): the MatMul weights as int8, in OpenVINO's own form.

The onnx backend's int8 copy (onnx_int8.py) expresses int8 as ONNX's DynamicQuantizeLinear and
MatMulInteger operators. OpenVINO has no fused kernels for those: it runs them as a chain of float
operations, slower than fp32 (measured), and making the copy needs onnxruntime. OpenVINO's own form
of an int8 matmul is an int8 weight that its kernels dequantize themselves (Constant i8 -> Convert ->
Multiply by a scale), with the activations quantized at run time in small groups
(openvino_compile.DYNAMIC_QUANTIZATION_GROUP) on CPUs with int8 dot-product instructions. So the
weights are quantized as the onnx copy quantizes them (the MatMul weights only, but the first block's
and the last, backends/int8_layers.py; symmetric, one scale per output channel) and handed to
OpenVINO in that form, in memory while the model loads: there is no file to cache.
"""

from __future__ import annotations

import numpy as np

from clipserve.backends.int8_layers import float_layers
from clipserve.backends.openvino.runtime import opset, ov


def quantize_matmul_weights(model: ov.Model) -> int:
    """Replace the constant 2-D float32 weight of every MatMul in `model` but those `float_layers` keeps by
    int8 values times one float32 scale per output channel; returns how many were replaced."""
    linear = []
    for node in model.get_ordered_ops():
        if node.get_type_name() != 'MatMul':
            continue
        weight = node.input_value(1).get_node()
        if weight.get_type_name() != 'Constant' or weight.get_element_type() != ov.Type.f32:
            continue
        values = weight.get_data()
        if values.ndim == 2:
            linear.append((node, values, bool(node.get_attributes().get('transpose_b'))))
    kept = float_layers([values.shape[::-1] if transposed else values.shape for _, values, transposed in linear])
    replaced = 0
    for index, (node, values, transposed) in enumerate(linear):
        if index in kept:
            continue
        # the reduced axis K: rows of a [K, N] weight, columns of an [N, K] one (transpose_b)
        quantized, scale = quantize(values, 1 if transposed else 0)
        dequantized = opset.multiply(opset.convert(opset.constant(quantized), ov.Type.f32), opset.constant(scale))
        node.input(1).replace_source_output(dequantized.output(0))
        replaced += 1
    model.validate_nodes_and_infer_types()
    return replaced


def quantize(values: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 over `axis`: (int8 values in [-127, 127], float32 scales with `axis` kept as 1)."""
    largest = np.abs(values).max(axis=axis, keepdims=True).astype(np.float32)
    scale = np.where(largest > 0, largest / 127, 1).astype(np.float32)
    quantized = np.clip(np.rint(values / scale), -127, 127).astype(np.int8)
    return quantized, scale
