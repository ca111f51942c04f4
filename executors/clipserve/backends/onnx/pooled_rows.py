"""The last operators run on the rows the model keeps only, rewritten in memory when a CPU session loads a float32
graph.

A CLIP tower keeps one row per item of its last layer's output (images: the class token; texts: the end token),
a reranker its first token's, but the exported graph computes the last layer's out-projection, MLP and layer
norms for every token and selects the row at the very end. Each of those operators works on each row alone, so
selecting first gives the same answer. This module moves the selection (a Gather along the sequence axis, or a
GatherND of one position per item) up above the row-wise operators that feed only it, selecting their other
inputs the same way. Operators it does not know to be row-wise, and inputs whose shape it cannot read, stop the
move; the backend checks a rewritten graph against the original on a sample before serving it
(backends/onnx/fused.py)."""

from __future__ import annotations

from clipserve.backends.onnx.graph_edit import drop_unused, has_subgraphs, shapes_of

# operators applied to each element alone; ONNX's broadcasting rules apply to their inputs
_ELEMENTWISE = {'Add', 'Sub', 'Mul', 'Div', 'Erf', 'Tanh', 'Sigmoid', 'Relu', 'Sqrt', 'Cast', 'Gelu', 'Identity'}
_ROW_OPS = _ELEMENTWISE | {'LayerNormalization', 'MatMul'}
_STATIC_OPS = {'Transpose', 'Cast', 'Identity', 'Reshape'}  # of constants only: still a constant
_SUFFIX = '_clipserve_pooled'


def pool_early(model) -> int:
    """Moves each pooling of `model` (an onnx ModelProto) above the row-wise operators that feed it alone;
    how many operators now run on the pooled rows only."""
    graph = model.graph
    if has_subgraphs(graph):
        return 0
    shapes = shapes_of(graph)
    moved = 0
    for pooling in [node for node in graph.node if _is_pooling(node, shapes)]:
        moved += _move_above(graph, pooling, shapes)
    if moved:
        drop_unused(graph)
    return moved


def _is_pooling(node, shapes) -> bool:
    """A selection of positions along the sequence axis (axis 1) that takes the same positions from any tensor
    of the same batch and sequence size."""
    data = shapes.get(node.input[0]) if node.input else None
    if data is None or len(data) < 3:
        return False
    attributes = {a.name: a.i for a in node.attribute}
    if node.op_type == 'Gather':
        return attributes.get('axis', 0) == 1
    if node.op_type == 'GatherND':
        indices = shapes.get(node.input[1])
        return attributes.get('batch_dims', 0) == 0 and indices is not None and indices[-1] == 2
    return False


def _move_above(graph, pooling, shapes) -> int:
    static = _static_names(graph)
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    region = _region(graph, pooling, consumers, static, shapes)
    if not region:
        return 0
    frontier = _inputs_from_outside(region, static)
    pooled = {name: name + _SUFFIX for name in [node.output[0] for node in region] + frontier}
    nodes = [_copy(pooling, [name, *pooling.input[1:]], [pooled[name]]) for name in frontier]
    for node in region:  # graph order, which is topological
        nodes.append(_copy(node, [pooled.get(name, name) for name in node.input], [pooled[node.output[0]]]))
    nodes.append(_identity(pooled[pooling.input[0]], pooling.output[0]))
    position = list(graph.node).index(pooling)
    graph.node.remove(pooling)
    for offset, node in enumerate(nodes):
        graph.node.insert(position + offset, node)
    return len(region)


def _region(graph, pooling, consumers, static, shapes) -> list:
    """The row-wise nodes whose outputs reach only `pooling` (through each other), in graph order; a node
    whose other inputs are not of the pooled tensor's batch and sequence size leaves it, and so on up."""
    pooled_shape = shapes[pooling.input[0]]
    outputs = {o.name for o in graph.output}
    excluded: set[int] = set()
    while True:
        members: list = []
        inside = {id(pooling)}
        for node in reversed(list(graph.node)):
            if id(node) in excluded or not _row_wise(node, static, shapes):
                continue
            users = [user for out in node.output for user in consumers.get(out, [])]
            if len(node.output) != 1 or node.output[0] in outputs or node.output[0] in pooling.input[1:] or not users:
                continue  # (the positions the pooling takes are needed whole)
            if all(id(user) in inside for user in users):
                members.append(node)
                inside.add(id(node))
        misfits = [
            name for name in _inputs_from_outside(members, static) if not _same_rows(shapes.get(name), pooled_shape)
        ]
        if not misfits:
            return members[::-1]
        excluded.update(id(node) for node in members if any(name in misfits for name in node.input))


def _inputs_from_outside(nodes, static) -> list[str]:
    """The non-constant inputs of `nodes` that none of them makes, once each, in the order first read."""
    produced = {node.output[0] for node in nodes}
    outside: list[str] = []
    for node in nodes:
        for name in node.input:
            if name and name not in static and name not in produced and name not in outside:
                outside.append(name)
    return outside


def _row_wise(node, static, shapes) -> bool:
    """Whether `node` computes each row of its output from the same row of its non-constant inputs alone."""
    if node.op_type not in _ROW_OPS or node.domain not in ('', 'ai.onnx'):
        return False
    inputs = [name for name in node.input if name]
    if node.op_type == 'MatMul':
        weight = shapes.get(inputs[1])
        return inputs[0] not in static and inputs[1] in static and weight is not None and len(weight) == 2
    if node.op_type == 'LayerNormalization':
        axis = next((a.i for a in node.attribute if a.name == 'axis'), -1)
        rank = shapes.get(inputs[0])
        if axis != -1 and (rank is None or axis != len(rank) - 1):
            return False
    if all(name in static for name in inputs):
        return False
    # a constant broadcast over a row only: never one that varies along the batch or sequence axes
    return all(name not in static or (shapes.get(name) is not None and len(shapes[name]) <= 1) for name in inputs)


def _same_rows(shape, pooled_shape) -> bool:
    """Whether a tensor of `shape` has the pooled tensor's rank and its batch and sequence sizes, so the pooling
    takes the same rows from it."""
    return (
        shape is not None
        and len(shape) == len(pooled_shape)
        and all(a == b and a is not None for a, b in zip(shape[:2], pooled_shape[:2]))
    )


def _static_names(graph) -> set[str]:
    """Initializers, Constant outputs, and what shape-only operators make of them."""
    static = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.op_type == 'Constant' or (
            node.op_type in _STATIC_OPS and all(name in static for name in node.input if name)
        ):
            static.update(node.output)
    return static


def _copy(node, inputs, outputs):
    from onnx import helper

    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == 'LayerNormalization':
        attributes['axis'] = -1  # the pooled rows have one axis fewer
    return helper.make_node(node.op_type, inputs, outputs, name=outputs[0], domain=node.domain, **attributes)


def _identity(source: str, target: str):
    from onnx import helper

    return helper.make_node('Identity', [source], [target], name=target + _SUFFIX)
