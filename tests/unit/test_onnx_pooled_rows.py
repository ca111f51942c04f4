"""The last layer's row-wise operators run on the pooled rows only (backends/onnx/pooled_rows.py): both towers of
the export rewritten with the same answers, and graphs where selecting first would change an answer left alone."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from clipserve.backends.onnx import fused
from clipserve.backends.onnx.attention import fuse_attention
from clipserve.backends.onnx.pooled_rows import pool_early

from ..onnx_helpers import make_clip_as_service_layout, plain_session, tower_feeds

WIDTH = 8


def _last_matmul_input_rank(model) -> int:
    """The rank of what the tower's last MLP product reads, from the graph's declared or derived shapes."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: len(v.type.tensor_type.shape.dim) for v in inferred.graph.value_info}
    products = [node for node in model.graph.node if node.op_type == 'MatMul']
    return shapes.get(products[-2].input[0])  # the last is the projection to the embedding


@pytest.mark.precision
@pytest.mark.parametrize('tower', ['visual.onnx', 'textual.onnx'])
def test_both_towers_select_their_row_before_the_last_layer(tiny_onnx_export, tower):
    model = onnx.load(str(tiny_onnx_export / tower), load_external_data=False)
    exported = plain_session(str(tiny_onnx_export / tower))
    fuse_attention(model, tiny_onnx_export)
    # the out-projection, residual, both layer norms and the MLP (texts also the mask's Cast and Mul)
    assert pool_early(model) >= 12
    assert _last_matmul_input_rank(model) == 2  # the MLP reads one row per item, not the whole sequence
    rewritten = plain_session(model.SerializeToString(), tiny_onnx_export)
    for rows in (1, 3):  # texts of different lengths padded together (different end positions), and one alone
        feeds = tower_feeds(tower, rows)
        np.testing.assert_allclose(rewritten.run(None, feeds)[0], exported.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_clip_as_service_layout_is_rewritten_too(tiny_onnx_export, tmp_path):
    folder = make_clip_as_service_layout(tiny_onnx_export, tmp_path / 'ViT-B-32-openai')
    for tower in ('visual.onnx', 'textual.onnx'):
        graph, done = fused.rewritten_graph(folder / tower)
        assert 'operators of the last layer run on the pooled rows only' in done
        feeds = fused.sample_feeds(plain_session(str(folder / tower)))
        np.testing.assert_allclose(
            plain_session(graph, folder).run(None, feeds)[0],
            plain_session(str(folder / tower)).run(None, feeds)[0],
            atol=1e-5,
        )


def _graph(extra_inputs=(), middle=(), extra_outputs=(), initializers=()):
    """x [batch, sequence, WIDTH] -> LayerNorm -> MatMul -> (middle) -> Gather of position 0 -> y [batch, WIDTH]."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(np.ones(WIDTH, np.float32), 'scale'),
        numpy_helper.from_array(np.zeros(WIDTH, np.float32), 'shift'),
        numpy_helper.from_array(rng.normal(size=(WIDTH, WIDTH)).astype(np.float32), 'w'),
        numpy_helper.from_array(np.array(0, np.int64), 'first'),
        *initializers,
    ]
    nodes = [
        helper.make_node('LayerNormalization', ['x', 'scale', 'shift'], ['normed'], axis=-1),
        helper.make_node('MatMul', ['normed', 'w'], ['m0']),
        *middle,
        helper.make_node('Gather', [f'm{len(middle)}', 'first'], ['y'], axis=1),
    ]
    rows = ['batch', 'sequence', WIDTH]
    inputs = [helper.make_tensor_value_info('x', TensorProto.FLOAT, rows), *extra_inputs]
    declared = [helper.make_tensor_value_info(f'm{i}', TensorProto.FLOAT, rows) for i in range(len(middle) + 1)]
    graph = helper.make_graph(
        nodes,
        'g',
        inputs,
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['batch', WIDTH]), *extra_outputs],
        weights,
        value_info=declared,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])


def _answers_kept(model, moved):
    feeds = {'x': np.random.default_rng(1).normal(size=(3, 5, WIDTH)).astype(np.float32)}
    for spec in model.graph.input[1:]:
        shape = [
            3 if d.dim_param == 'batch' else 5 if d.dim_param == 'sequence' else d.dim_value
            for d in spec.type.tensor_type.shape.dim
        ]
        feeds[spec.name] = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    expected = plain_session(model.SerializeToString()).run(['y'], feeds)[0]
    assert pool_early(model) == moved
    np.testing.assert_allclose(
        plain_session(model.SerializeToString()).run(['y'], feeds)[0], expected, rtol=1e-5, atol=1e-6
    )


def test_a_plain_row_wise_graph_is_moved_whole():
    _answers_kept(_graph(), moved=2)


def test_an_input_of_every_row_is_selected_the_same_way():
    per_row = helper.make_tensor_value_info('e', TensorProto.FLOAT, ['batch', 'sequence', 1])
    _answers_kept(_graph([per_row], [helper.make_node('Mul', ['m0', 'e'], ['m1'])]), moved=3)


def test_an_input_shared_along_the_sequence_stops_the_move():
    """A tensor of one row per item (broadcast over the sequence): the Add above it stays whole, and so does
    everything above it."""
    shared = helper.make_tensor_value_info('e', TensorProto.FLOAT, ['batch', 1, WIDTH])
    _answers_kept(_graph([shared], [helper.make_node('Add', ['m0', 'e'], ['m1'])]), moved=0)


def test_a_constant_that_varies_along_the_sequence_stops_the_move():
    positions = numpy_helper.from_array(np.arange(5 * WIDTH, dtype=np.float32).reshape(5, WIDTH), 'positions')
    middle = [helper.make_node('Add', ['m0', 'positions'], ['m1'])]
    _answers_kept(_graph(middle=middle, initializers=[positions]), moved=0)


def test_an_operator_that_mixes_rows_stops_the_move():
    middle = [helper.make_node('Softmax', ['m0'], ['m1'], axis=1), helper.make_node('Relu', ['m1'], ['m2'])]
    _answers_kept(_graph(middle=middle), moved=1)  # the Relu only


def test_a_tensor_read_elsewhere_is_computed_whole():
    whole = helper.make_tensor_value_info('m0', TensorProto.FLOAT, ['batch', 'sequence', WIDTH])
    middle = [helper.make_node('Relu', ['m0'], ['m1'])]
    _answers_kept(_graph(middle=middle, extra_outputs=[whole]), moved=1)  # the Relu; m0 is an output itself
