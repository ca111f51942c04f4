"""What the graph rewrites (backends/onnx/attention.py, pooled_rows.py, int8.py) share: whether a graph has
subgraphs, the shapes it declares, removing what nothing reads any more, and onnxruntime's operator domain."""

from __future__ import annotations

Dim = int | str | None  # a size, a named (symbolic) size, or unknown
CONTRIB_DOMAIN = 'com.microsoft'  # onnxruntime's own operators (Attention, MatMulIntegerToFloat)


def use_contrib_domain(model) -> None:
    """Declare onnxruntime's operator domain in `model` (an onnx ModelProto), once."""
    from onnx import helper

    if not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))


def has_subgraphs(graph) -> bool:
    """Whether a node holds a graph of its own (If, Loop, Scan): those may read names the rewrites cannot see,
    so such graphs are left alone."""
    return any(attr.type in (attr.GRAPH, attr.GRAPHS) for node in graph.node for attr in node.attribute)


def shapes_of(graph) -> dict[str, tuple[Dim, ...]]:
    """The declared shape of every tensor the graph states one for: its inputs, outputs and value_info, its
    initializers and Constant nodes, and transposes of those."""
    shapes: dict[str, tuple[Dim, ...]] = {}
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.HasField('tensor_type') and info.type.tensor_type.HasField('shape'):
            shapes[info.name] = tuple(_dim(d) for d in info.type.tensor_type.shape.dim)
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    for node in graph.node:
        if node.op_type == 'Constant' and node.attribute and node.attribute[0].HasField('t'):
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
        elif node.op_type == 'Transpose' and node.input[0] in shapes and node.output[0] not in shapes:
            source = shapes[node.input[0]]
            shapes[node.output[0]] = tuple(source[i] for i in transpose_perm(node, len(source)))
    return shapes


def _dim(dim) -> Dim:
    if dim.HasField('dim_value'):
        return dim.dim_value
    return dim.dim_param or None


def transpose_perm(node, rank: int) -> list[int]:
    """A Transpose node's permutation of `rank` axes: its `perm`, or ONNX's default (the axes reversed)."""
    perm = next((list(a.ints) for a in node.attribute if a.name == 'perm'), None)
    return perm or list(range(rank))[::-1]


def drop_unused(graph) -> None:
    """Removes nodes whose outputs nothing reads (repeatedly), then initializers nothing reads."""
    needed_outputs = {o.name for o in graph.output}
    while True:
        read = needed_outputs | {name for node in graph.node for name in node.input}
        dead = [node for node in graph.node if not any(out in read for out in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    read = {name for node in graph.node for name in node.input}
    unused = [t for t in graph.initializer if t.name not in read]
    for tensor in unused:
        graph.initializer.remove(tensor)
