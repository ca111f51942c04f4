"""onnxruntime's fused `Attention` operator in place of the exported attention's many small operators, made in
memory when a CPU session loads a float32 tower.

The exporter writes each `nn.MultiheadAttention` of an open_clip tower as a few dozen small operators (the
packed q/k/v split by Squeeze and Gather, reshapes and transposes between the sequence-first and head-first
layouts, q and k each scaled, a causal mask added for texts), and onnxruntime fuses none of them: its own
transformer optimizer does not recognise this exporter's form. This module finds that form and puts one
`com.microsoft.Attention` in its place (the same in-projection weight and bias, the same scale, `unidirectional`
where the added mask is the causal one), the out-projection becoming MatMul (and Add). What it does not
recognise stays as it is. No weight is copied: the rewritten graph goes to onnxruntime as bytes and its weights
are read from the export's folder as before. The backend checks a rewritten graph against the original on a
sample before serving it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clipserve.backends.onnx.graph_edit import CONTRIB_DOMAIN, drop_unused, has_subgraphs, use_contrib_domain

# the q path, back from its scaling Mul to the in-projection's bias
_Q_PATH = ('Reshape', 'Transpose', 'Reshape', 'Gather', 'Squeeze', 'Transpose', 'Unsqueeze', 'Reshape', 'Add')
_LARGEST_CONSTANT = 1 << 20  # elements: masks and shapes are read, weights never
_PLAIN_GEMM = {'transA': 0, 'transB': 1, 'alpha': 1.0, 'beta': 1.0}  # x @ weight.T (+ bias)
_GEMM_DEFAULTS = {'transA': 0, 'transB': 0, 'alpha': 1.0, 'beta': 1.0}  # ONNX's, for attributes left out
_OUT_PATH = ('MatMul', 'Transpose', 'Reshape', 'Gemm', 'Reshape', 'Transpose')  # from the Softmax on


def fuse_attention(model, folder: Path | None = None, projection_inside: bool = True) -> int:
    """Rewrites every recognised attention layer of `model` (an onnx ModelProto) in place; the count.
    `folder` holds its external data, for the small constants the match reads (a causal mask). With
    `projection_inside` (float graphs) the in-projection's weight goes into `Attention` itself; without it the
    in-projection stays a MatMul of its own feeding `MultiHeadAttention`, so that a quantizer after this
    rewrite finds it as a linear layer (backends/onnx/int8.py)."""
    if has_subgraphs(model.graph):
        return 0
    graph = _Graph(model.graph, folder)
    layers = [layer for softmax in graph.nodes_of('Softmax') if (layer := _match(graph, softmax))]
    for index, layer in enumerate(layers):
        prefix = f'clipserve_attention_{index}'
        graph.replace(
            layer, _fused_nodes(layer, prefix) if projection_inside else _projected_nodes(graph, layer, prefix)
        )
        graph.declare_like(f'{prefix}_heads', layer.output, graph.dims(layer.weight)[0])
    if layers:
        drop_unused(model.graph)
        use_contrib_domain(model)
    return len(layers)


@dataclass(frozen=True)
class _Attention:
    """One recognised layer: its input (batch-first), in-projection, scale, mask and output."""

    source: str
    weight: str
    bias: str
    heads: int
    scale: float
    causal: bool
    out_weight: str
    out_bias: str | None
    output: str
    last_node: object  # the node whose output the fused nodes take over


def _fused_nodes(layer: _Attention, prefix: str) -> list:
    attention = _attention_node('Attention', [layer.source, layer.weight, layer.bias], layer, prefix)
    return [attention, *_out_projection(layer, prefix)]


def _projected_nodes(graph: _Graph, layer: _Attention, prefix: str) -> list:
    """The in-projection as a MatMul, split into q, k and v for `MultiHeadAttention` (which adds their bias)."""
    from onnx import helper, numpy_helper

    width = graph.dims(layer.weight)[0]
    graph.graph.initializer.append(numpy_helper.from_array(np.array([width] * 3, np.int64), f'{prefix}_split'))
    qkv = [f'{prefix}_q', f'{prefix}_k', f'{prefix}_v']
    return [
        helper.make_node('MatMul', [layer.source, layer.weight], [f'{prefix}_packed'], name=f'{prefix}_in'),
        helper.make_node('Split', [f'{prefix}_packed', f'{prefix}_split'], qkv, name=f'{prefix}_split', axis=-1),
        _attention_node('MultiHeadAttention', [*qkv, layer.bias], layer, prefix),
        *_out_projection(layer, prefix),
    ]


def _attention_node(op: str, inputs: list[str], layer: _Attention, prefix: str):
    """onnxruntime's `op` (Attention or MultiHeadAttention) with the layer's heads, scale and causal mask."""
    from onnx import helper

    return helper.make_node(
        op,
        inputs,
        [f'{prefix}_heads'],
        name=prefix,
        domain=CONTRIB_DOMAIN,
        num_heads=layer.heads,
        scale=layer.scale,
        unidirectional=int(layer.causal),
    )


def _out_projection(layer: _Attention, prefix: str) -> list:
    """The heads' output times the out-projection (and its bias), batch-first as the layer's output is."""
    from onnx import helper

    # Gemm's weight is [out, in]; the transpose of a constant is folded when the session loads
    transposed = helper.make_node('Transpose', [layer.out_weight], [f'{prefix}_wt'], name=f'{prefix}_wt', perm=[1, 0])
    projected = f'{prefix}_projected' if layer.out_bias else layer.output
    nodes = [transposed, helper.make_node('MatMul', [f'{prefix}_heads', f'{prefix}_wt'], [projected])]
    if layer.out_bias:
        nodes.append(helper.make_node('Add', [projected, layer.out_bias], [layer.output], name=f'{prefix}_bias'))
    return nodes


class _Graph:
    """An onnx graph's producers, consumers and constants, for matching the exporter's attention."""

    def __init__(self, graph, folder: Path | None):
        from onnx import numpy_helper

        self.graph = graph
        self.folder = folder
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self._initializers = {t.name: t for t in graph.initializer}
        self._to_array = numpy_helper.to_array

    def nodes_of(self, op: str) -> list:
        return [node for node in self.graph.node if node.op_type == op]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node (external weights are not read: None for those)."""
        tensor = self._initializers.get(name)
        if tensor is None:
            node = self.producer.get(name)
            if node is None or node.op_type != 'Constant' or not node.attribute or not node.attribute[0].HasField('t'):
                return None
            tensor = node.attribute[0].t
        if tensor.data_location == tensor.EXTERNAL:
            if self.folder is None or int(np.prod(tensor.dims)) > _LARGEST_CONSTANT:
                return None
            return self._to_array(tensor, str(self.folder))
        return self._to_array(tensor)

    def dims(self, name: str) -> tuple[int, ...] | None:
        tensor = self._initializers.get(name)
        return tuple(tensor.dims) if tensor is not None else None

    def sole_consumer(self, name: str, op: str):
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def chain_forward(self, node, ops) -> list | None:
        found = []
        for op in ops:
            node = self.sole_consumer(node.output[0], op)
            if node is None:
                return None
            found.append(node)
        return found

    def chain_back(self, name: str, ops) -> list | None:
        found = []
        for op in ops:
            node = self.producer.get(name)
            if node is None or node.op_type != op:
                return None
            found.append(node)
            name = node.input[0]
        return found

    def replace(self, layer: _Attention, nodes: list) -> None:
        position = list(self.graph.node).index(layer.last_node)
        self.graph.node.remove(layer.last_node)
        for offset, node in enumerate(nodes):
            self.graph.node.insert(position + offset, node)

    def declare_like(self, name: str, like: str, width: int) -> None:
        """Declares `name` of the type and shape declared for `like` but `width` wide, if `like` has a declared
        shape (for the rewrites after this one: backends/onnx/pooled_rows.py)."""
        declared = next((info for info in self.graph.value_info if info.name == like), None)
        if declared is not None and declared.type.tensor_type.shape.dim:
            info = self.graph.value_info.add()
            info.CopyFrom(declared)
            info.name = name
            info.type.tensor_type.shape.dim[-1].Clear()
            info.type.tensor_type.shape.dim[-1].dim_value = width


def _match(graph: _Graph, softmax) -> _Attention | None:
    """The layer whose Softmax this is, when every part of it has the exporter's form; else None."""
    out = graph.chain_forward(softmax, _OUT_PATH)
    if out is None:
        return None
    weighted, heads_first, _, gemm, _, batch_first = out
    if weighted.input[0] != softmax.output[0] or _perm(heads_first) != [2, 0, 1, 3] or _perm(batch_first) != [1, 0, 2]:
        return None
    if {**_GEMM_DEFAULTS, **_attrs(gemm)} != _PLAIN_GEMM or graph.dims(gemm.input[1]) is None:
        return None
    scores, causal = _scores(graph, softmax)
    if scores is None:
        return None
    projection = _in_projection(graph, scores, weighted)
    if projection is None:
        return None
    source, weight, bias, heads, scale = projection
    return _Attention(
        source=source,
        weight=weight,
        bias=bias,
        heads=heads,
        scale=scale,
        causal=causal,
        out_weight=gemm.input[1],
        out_bias=gemm.input[2] if len(gemm.input) > 2 and gemm.input[2] else None,
        output=batch_first.output[0],
        last_node=batch_first,
    )


def _scores(graph: _Graph, softmax):
    """The q·k MatMul feeding `softmax` and whether a causal mask is added to it; (None, _) for any other form."""
    node = graph.producer.get(softmax.input[0])
    if node is not None and node.op_type == 'MatMul':
        return node, False
    if node is None or node.op_type != 'Add':
        return None, False
    for scores_name, mask_name in (node.input, reversed(node.input)):
        scores = graph.producer.get(scores_name)
        if scores is not None and scores.op_type == 'MatMul' and _is_causal(graph, mask_name):
            return scores, True
    return None, False


def _is_causal(graph: _Graph, name: str) -> bool:
    """Whether `name` is a leading square of the tower's causal mask (0 on and below the diagonal, a large
    negative number above it), unsqueezed for the heads."""
    path = graph.chain_back(name, ('Unsqueeze', 'Slice', 'Slice'))
    if path is None:
        return False
    mask = graph.constant(path[-1].input[0])
    if mask is None or mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        return False
    upper = np.triu(np.ones(mask.shape, dtype=bool), k=1)
    return bool(np.all(mask[~upper] == 0) and np.all(mask[upper] <= -1e4))


def _in_projection(graph: _Graph, scores, weighted):
    """(input, weight, bias, heads, scale) of the packed in-projection that q, k and v are split from."""
    scaled_q, scaled_k = (graph.producer.get(name) for name in scores.input)
    if scaled_q is None or scaled_k is None or scaled_q.op_type != 'Mul' or scaled_k.op_type != 'Mul':
        return None
    q_scale, k_scale = graph.constant(scaled_q.input[1]), graph.constant(scaled_k.input[1])
    if q_scale is None or k_scale is None or q_scale.size != 1 or not np.array_equal(q_scale, k_scale):
        return None
    path = graph.chain_back(scaled_q.input[0], _Q_PATH)
    if path is None:
        return None
    heads_shape, heads_swap, _, select_q, split, unpack, _, _, bias_add = path
    if _perm(heads_swap) != [1, 0, 2] or _perm(unpack) != [3, 1, 2, 0, 4]:
        return None
    packed = split.output[0]
    for value, selected in (
        (0, select_q),
        (1, _gather_above(graph, scaled_k.input[0])),
        (2, _gather_above(graph, weighted.input[1])),
    ):
        if selected is None or selected.input[0] != packed or not _selects(graph, selected, value):
            return None
    matmul = graph.producer.get(bias_add.input[0])
    if matmul is None or matmul.op_type != 'MatMul':
        return None
    to_sequence_first = graph.producer.get(matmul.input[0])
    if to_sequence_first is None or to_sequence_first.op_type != 'Transpose' or _perm(to_sequence_first) != [1, 0, 2]:
        return None
    weight, bias = graph.dims(matmul.input[1]), graph.dims(bias_add.input[1])
    head_size = _last_value(graph, heads_shape.input[1])
    if weight is None or bias is None or head_size is None or len(weight) != 2 or weight[1] != 3 * weight[0]:
        return None
    if bias != (weight[1],) or weight[0] % head_size:
        return None
    scale = float(q_scale.reshape(-1)[0]) ** 2
    return to_sequence_first.input[0], matmul.input[1], bias_add.input[1], weight[0] // head_size, scale


def _gather_above(graph: _Graph, name: str):
    """The Gather that `name` comes from through reshapes and transposes only."""
    for _ in range(8):
        node = graph.producer.get(name)
        if node is None or node.op_type not in ('Reshape', 'Transpose', 'Gather'):
            return None
        if node.op_type == 'Gather':
            return node
        name = node.input[0]
    return None


def _selects(graph: _Graph, gather, value: int) -> bool:
    index = graph.constant(gather.input[1])
    return (
        index is not None
        and index.size == 1
        and int(index.reshape(-1)[0]) == value
        and _attrs(gather).get('axis', 0) == 0
    )


def _last_value(graph: _Graph, name: str) -> int | None:
    """The last element of a shape that is a constant or a Concat ending in one (the heads' size)."""
    node = graph.producer.get(name)
    if node is not None and node.op_type == 'Concat':
        name = node.input[-1]
    value = graph.constant(name)
    if value is None or value.size < 1 or int(value.reshape(-1)[-1]) <= 0:
        return None
    return int(value.reshape(-1)[-1])


def _perm(node) -> list[int] | None:
    return _attrs(node).get('perm')


def _attrs(node) -> dict:
    from onnx import helper

    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
