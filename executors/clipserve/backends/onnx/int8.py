"""int8 copies of ONNX graphs for CPUs (`dtype: int8` on the onnx backend), quantized once and cached
(backends/onnx/copies.py), checked on the running CPU before serving (backends/int8_check.py).

Every linear layer (a MatMul or Gemm by a constant 2-d weight or its transpose) becomes an integer matrix
product, except the first transformer block's and the last layer, which stay float (backends/int8_layers.py
says why):

- weights int8 per output channel, symmetric, each channel's scale chosen to minimise its rounding error
  (clipping the rare extreme weights when that pays). On CPUs with int8 dot products (VNNI, AMX) the
  weights use 8 bits. CPUs without them (AVX2) multiply uint8 by int8 and add each pair of products in
  16 bits, saturating: there the weights use 7 bits (|w| <= 63), so the sum of a pair stays below 2^15;
- activations quantized per row (each token of each input alone), symmetric, as uint8 around one scalar
  zero point of 128 (the form the integer kernels take): an input's embedding does not depend on
  what shares its batch or on the padding of its batch mates, and an outlier token costs only its own row.

Each layer is a few operators, every one a pass over its activations, so they are the fewest that keep that
form: QuantizeLinear rounds, shifts and casts a row already scaled, and onnxruntime's MatMulIntegerToFloat
applies the weights' scales in the product's own output step; only the rows' scale (which it does not take)
and the bias follow. The float graph is first rewritten as the float sessions are (backends/onnx/fused.py), with
attention fused around its in-projection rather than inside it, so that projection is quantized too and the
attention itself runs as one operator.

onnxruntime's `quantize_dynamic` was the first choice; it quantizes a whole activation tensor with one
scale, so embeddings changed with their batch mates, and its 8-bit weights saturate the AVX2 kernels
(docs/concepts/precision.md has both measurements).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from clipserve.backends.cpu_features import cpu_features
from clipserve.backends.int8_layers import float_layers
from clipserve.backends.onnx.copies import DATA_FILE, converted_copy
from clipserve.backends.onnx.fused import float_graph_to_quantize
from clipserve.backends.onnx.graph_edit import CONTRIB_DOMAIN, drop_unused, transpose_perm, use_contrib_domain

FORMAT = 5  # bump when the quantization changes, so cached copies are redone
ACTIVATION_ZERO_POINT = 128
TOWERS = ('visual.onnx', 'textual.onnx')

logger = logging.getLogger(__name__)


def int8_copy(source: Path) -> Path:
    """The int8 copy of the ONNX graph `source` (inputs and outputs stay float32), quantizing it if needed;
    a graph `TOWERS` leaves out is returned as it is."""
    if Path(source).name not in TOWERS:
        return Path(source)
    bits = weight_bits()
    return converted_copy(source, f'int8-w{bits}', lambda src, dst: quantize_int8(src, dst, bits), FORMAT)


def weight_bits() -> int:
    """8 where the CPU has int8 dot products (no 16-bit pair sums to saturate), else 7."""
    return 8 if cpu_features().int8_dot else 7


def quantize_int8(source: Path, destination: Path, bits: int = 7) -> None:
    import onnx

    model = float_graph_to_quantize(Path(source))
    count = quantize_linear_layers(model, bits)
    logger.info('%s: %d linear layers quantized to int8', Path(source).name, count)
    onnx.save_model(
        model, str(destination), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE
    )


def quantize_linear_layers(model, bits: int = 7) -> int:
    """Rewrite `model` (an onnx ModelProto) in place; returns how many layers became integer products."""
    from onnx import numpy_helper

    graph = model.graph
    weights = {w.name: w for w in graph.initializer}
    transposed = _transposed_constants(graph, weights)
    _add_shared_constants(graph)
    linear = [i for i, node in enumerate(graph.node) if _linear_weight(node, weights, transposed) is not None]
    shapes = [_weight_shape(graph.node[i], weights, transposed) for i in linear]
    kept = {linear[i] for i in float_layers(shapes)}
    nodes, count = [], 0
    for index, node in enumerate(graph.node):
        weight = None if index in kept else _linear_weight(node, weights, transposed)
        if weight is None:
            nodes.append(node)
            continue
        matrix, bias = weight
        count += 1
        array = numpy_helper.to_array(weights[matrix[0]])
        nodes += _integer_product(node, array, matrix[1], bias, f'int8_{count}', graph, bits)
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unused(graph)
    if count:
        use_contrib_domain(model)
    return count


def _transposed_constants(graph, weights) -> dict[str, str]:
    """The outputs of Transpose nodes that only swap the two axes of a 2-d constant, and that constant's name."""
    found = {}
    for node in graph.node:
        if node.op_type != 'Transpose' or node.input[0] not in weights or len(weights[node.input[0]].dims) != 2:
            continue
        if transpose_perm(node, 2) == [1, 0]:
            found[node.output[0]] = node.input[0]
    return found


def _linear_weight(node, weights, transposed_constants) -> tuple[tuple[str, bool], str | None] | None:
    """((weight name, transposed), bias name) when `node` is a linear layer with a constant 2-d weight (or its
    transpose: `transposed_constants` maps a transposed constant to that constant's name)."""
    from onnx import helper

    if node.op_type == 'MatMul' and node.input[1] in weights and len(weights[node.input[1]].dims) == 2:
        return (node.input[1], False), None
    if node.op_type == 'MatMul' and node.input[1] in transposed_constants:
        return (transposed_constants[node.input[1]], True), None
    if node.op_type == 'Gemm' and node.input[1] in weights:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get('transA', 0) or attributes.get('alpha', 1.0) != 1.0 or attributes.get('beta', 1.0) != 1.0:
            return None
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        return (node.input[1], bool(attributes.get('transB', 0))), bias
    return None


def _weight_shape(node, weights, transposed_constants) -> tuple[int, ...]:
    (name, transposed), _ = _linear_weight(node, weights, transposed_constants)
    dims = tuple(weights[name].dims)
    return dims[::-1] if transposed else dims


def _add_shared_constants(graph) -> None:
    """The few constants every quantized layer uses, added once."""
    from onnx import numpy_helper

    for name, value in (
        ('int8_axes', np.array([-1], np.int64)),
        ('int8_tiny', np.array(1e-12, np.float32)),
        ('int8_127', np.array(127.0, np.float32)),
        ('int8_one', np.array(1.0, np.float32)),
        ('int8_zero_point', np.array(ACTIVATION_ZERO_POINT, np.uint8)),
    ):
        graph.initializer.append(numpy_helper.from_array(value, name))


def channel_scales(matrix: np.ndarray, limit: int) -> np.ndarray:
    """Per output channel (column), the scale among clipping ratios 0.5..1 of the largest weight that makes the
    smallest squared rounding error: a few extreme weights no longer coarsen every other weight's step."""
    largest = np.maximum(np.abs(matrix).max(axis=0), 1e-12)
    best, best_error = largest / limit, None
    for ratio in np.linspace(1.0, 0.5, 26):
        scale = largest * ratio / limit
        error = ((np.clip(np.round(matrix / scale), -limit, limit) * scale - matrix) ** 2).sum(axis=0)
        if best_error is None:
            best_error = error
            continue
        better = error < best_error
        best, best_error = np.where(better, scale, best), np.where(better, error, best_error)
    return best.astype(np.float32)


def _integer_product(
    node, weight: np.ndarray, transposed: bool, bias: str | None, prefix: str, graph, bits: int
) -> list:
    """The nodes computing `node`'s output as (per-row uint8 activations) x (per-channel int8 weights)."""
    from onnx import helper, numpy_helper

    matrix = (weight.T if transposed else weight).astype(np.float32)  # [in, out]
    limit = 2 ** (bits - 1) - 1
    channel_scale = channel_scales(matrix, limit)
    quantized = np.clip(np.round(matrix / channel_scale), -limit, limit).astype(np.int8)
    graph.initializer.append(numpy_helper.from_array(quantized, f'{prefix}_weight'))
    graph.initializer.append(numpy_helper.from_array(channel_scale.astype(np.float32), f'{prefix}_weight_scale'))
    x, out = node.input[0], node.output[0]

    def op(kind, inputs, name, **attributes):
        return helper.make_node(kind, inputs, [f'{prefix}_{name}'], name=f'{prefix}_{name}', **attributes)

    nodes = [
        op('Abs', [x], 'abs'),
        op('ReduceMax', [f'{prefix}_abs', 'int8_axes'], 'row_max', keepdims=1),
        op('Max', [f'{prefix}_row_max', 'int8_tiny'], 'row_max_safe'),
        op('Div', [f'{prefix}_row_max_safe', 'int8_127'], 'row_scale'),
        op('Reciprocal', [f'{prefix}_row_scale'], 'row_inverse'),
        op('Mul', [x, f'{prefix}_row_inverse'], 'scaled'),
        # rounds half to even as Round does, adds the zero point and casts, in one pass
        op('QuantizeLinear', [f'{prefix}_scaled', 'int8_one', 'int8_zero_point'], 'uint8'),
        # the integer product, cast and scaled per weight channel in the kernel's own output step
        helper.make_node(
            'MatMulIntegerToFloat',
            [f'{prefix}_uint8', f'{prefix}_weight', 'int8_one', f'{prefix}_weight_scale', 'int8_zero_point'],
            [f'{prefix}_channel_scaled'],
            name=f'{prefix}_product_channels',
            domain=CONTRIB_DOMAIN,
        ),
    ]
    last = helper.make_node(
        'Mul',
        [f'{prefix}_channel_scaled', f'{prefix}_row_scale'],
        [out if bias is None else f'{prefix}_product'],
        name=f'{prefix}_product',
    )
    nodes.append(last)
    if bias is not None:
        nodes.append(helper.make_node('Add', [f'{prefix}_product', bias], [out], name=f'{prefix}_bias'))
    return nodes
