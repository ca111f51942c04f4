"""The exported attention fused into onnxruntime's Attention operator (backends/onnx/attention.py, fused.py):
every layer of both towers found, the same answers as the graph as exported, and anything else left alone. The
form the int8 copies start from (MultiHeadAttention after an in-projection of its own) is checked the same way."""

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from clipserve.backends import BackendOptions
from clipserve.backends.onnx import fused
from clipserve.backends.onnx.attention import fuse_attention
from clipserve.backends.onnx.backend import OnnxBackend

from ..conftest import TINY
from ..onnx_helpers import make_clip_as_service_layout, plain_session, tower_feeds

LAYERS = 2  # clipserve-tiny's towers each have two
HEADS = 2


def _attention_nodes(model, op='Attention'):
    return [node for node in model.graph.node if node.op_type == op and node.domain == 'com.microsoft']


@pytest.mark.parametrize('tower', ['visual.onnx', 'textual.onnx'])
def test_every_attention_layer_of_both_towers_is_fused(tiny_onnx_export, tower):
    model = onnx.load(str(tiny_onnx_export / tower), load_external_data=False)
    assert fuse_attention(model, tiny_onnx_export) == LAYERS
    nodes = _attention_nodes(model)
    assert len(nodes) == LAYERS and not [n for n in model.graph.node if n.op_type == 'Softmax']
    for node in nodes:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attributes['num_heads'] == HEADS
        assert attributes['unidirectional'] == (tower == 'textual.onnx')  # the text tower's causal mask
        assert attributes['scale'] == pytest.approx((64 // HEADS) ** -0.5, rel=1e-6)


@pytest.mark.precision
@pytest.mark.parametrize('tower', ['visual.onnx', 'textual.onnx'])
def test_the_fused_graph_answers_as_the_exported_one(tiny_onnx_export, tower):
    graph, done = fused.rewritten_graph(tiny_onnx_export / tower)
    assert f"{LAYERS} attention layers fused into onnxruntime's Attention" in done
    exported, rewritten = plain_session(str(tiny_onnx_export / tower)), plain_session(graph, tiny_onnx_export)
    for rows in (1, 3):  # texts of different lengths padded together, and one alone
        feeds = tower_feeds(tower, rows)
        expected, answer = exported.run(None, feeds)[0], rewritten.run(None, feeds)[0]
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.precision
@pytest.mark.parametrize('tower', ['visual.onnx', 'textual.onnx'])
def test_the_in_projection_can_stay_a_matmul_of_its_own(tiny_onnx_export, tower):
    """The form a quantizer starts from: the in-projection a MatMul by the same weight, MultiHeadAttention after."""
    graph, done = fused.rewritten_graph(tiny_onnx_export / tower, projection_inside=False)
    assert f"{LAYERS} attention layers fused into onnxruntime's MultiHeadAttention" in done
    model = onnx.ModelProto.FromString(graph)
    nodes = _attention_nodes(model, 'MultiHeadAttention')
    assert (
        len(nodes) == LAYERS and not _attention_nodes(model) and 'Softmax' not in [n.op_type for n in model.graph.node]
    )
    weights = {t.name for t in model.graph.initializer}
    in_projections = [n for n in model.graph.node if n.op_type == 'MatMul' and n.name.endswith('_in')]
    assert len(in_projections) == LAYERS and all(n.input[1] in weights for n in in_projections)
    for node in nodes:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attributes['num_heads'], attributes['unidirectional']) == (HEADS, tower == 'textual.onnx')
    exported, rewritten = plain_session(str(tiny_onnx_export / tower)), plain_session(graph, tiny_onnx_export)
    for rows in (1, 3):
        feeds = tower_feeds(tower, rows)
        expected, answer = exported.run(None, feeds)[0], rewritten.run(None, feeds)[0]
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5)


def test_clip_as_service_layout_is_fused_too(tiny_onnx_export, tmp_path):
    """Weights inline, int32 inputs cast to int64, a fixed 77-token text input."""
    folder = make_clip_as_service_layout(tiny_onnx_export, tmp_path / 'ViT-B-32-openai')
    for tower in ('visual.onnx', 'textual.onnx'):
        graph, done = fused.rewritten_graph(folder / tower)
        assert f'{LAYERS} attention layers fused' in done
        feeds = fused.sample_feeds(plain_session(str(folder / tower)))
        np.testing.assert_allclose(
            plain_session(graph, folder).run(None, feeds)[0],
            plain_session(str(folder / tower)).run(None, feeds)[0],
            atol=1e-5,
        )


def test_a_mask_that_is_not_causal_is_left_alone(tiny_onnx_export, tmp_path):
    model = onnx.load(str(tiny_onnx_export / 'textual.onnx'))
    mask = next(t for t in model.graph.initializer if t.name.endswith('attn_mask'))
    mask.CopyFrom(numpy_helper.from_array(np.zeros(numpy_helper.to_array(mask).shape, np.float32), mask.name))
    assert fuse_attention(model, tmp_path) == 0
    assert not _attention_nodes(model)


@pytest.mark.parametrize(
    'changed',
    [('alpha', 2.0), ('transB', None)],  # a scaled out-projection; one left at ONNX's default transB=0 (x @ weight)
)
def test_a_layer_of_another_form_is_left_alone_and_the_rest_fused(tiny_onnx_export, changed):
    name, value = changed
    model = onnx.load(str(tiny_onnx_export / 'visual.onnx'))
    exported = plain_session(model.SerializeToString())
    gemm = next(node for node in model.graph.node if node.op_type == 'Gemm')
    kept = [a for a in gemm.attribute if a.name != name]
    del gemm.attribute[:]
    gemm.attribute.extend(kept + ([onnx.helper.make_attribute(name, value)] if value is not None else []))
    feeds = tower_feeds('visual.onnx', 2)
    expected = plain_session(model.SerializeToString()).run(None, feeds)[0]
    assert fuse_attention(model) == LAYERS - 1
    np.testing.assert_allclose(plain_session(model.SerializeToString()).run(None, feeds)[0], expected, atol=1e-5)
    assert not np.allclose(exported.run(None, feeds)[0], expected, atol=1e-5)  # the changed layer counts


def test_the_backend_serves_fused_float32_towers(tiny_onnx_export, caplog):
    with caplog.at_level(logging.INFO, logger=fused.__name__):
        backend = OnnxBackend(TINY, BackendOptions(device='cpu', dtype='fp32'), model_path=str(tiny_onnx_export))
    for session in (backend.visual, backend.textual):
        options = session.get_session_options()
        assert options.get_session_config_entry(fused.EXTERNAL_DATA_FOLDER) == str(tiny_onnx_export)
        assert options.get_session_config_entry('session.force_spinning_stop') == '1'  # the backend's own options
    assert caplog.text.count("attention layers fused into onnxruntime's Attention") == 2
    assert caplog.text.count('operators of the last layer run on the pooled rows only') == 2


def test_a_fused_graph_that_answers_differently_does_not_serve(tiny_onnx_export, monkeypatch, caplog):
    rewrite = fused.rewritten_graph

    def wrong_scale(path, projection_inside=True):
        graph, done = rewrite(path, projection_inside)
        model = onnx.ModelProto.FromString(graph)
        for node in _attention_nodes(model) + _attention_nodes(model, 'MultiHeadAttention'):
            next(a for a in node.attribute if a.name == 'scale').f *= 4
        return model.SerializeToString(), done

    monkeypatch.setattr(fused, 'rewritten_graph', wrong_scale)
    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        session = fused.cpu_session(tiny_onnx_export / 'visual.onnx', ort.SessionOptions)
    assert 'the rewritten graph answered differently on a sample; serving the graph as exported' in caplog.text
    feeds = tower_feeds('visual.onnx', 2)
    exported = plain_session(str(tiny_onnx_export / 'visual.onnx')).run(None, feeds)[0]
    np.testing.assert_array_equal(session.run(None, feeds)[0], exported)
    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        to_quantize = fused.float_graph_to_quantize(tiny_onnx_export / 'visual.onnx')
    assert 'the rewritten graph answered differently on a sample; quantizing it as exported' in caplog.text
    assert not _attention_nodes(to_quantize, 'MultiHeadAttention')
    assert [n.op_type for n in to_quantize.graph.node].count('Softmax') == LAYERS


def test_a_graph_without_a_sample_serves_as_exported(tiny_onnx_export, monkeypatch, caplog):
    """A sample the exported graph cannot run (here: of the wrong rank) leaves nothing to check a rewrite on."""
    monkeypatch.setattr(fused, 'sample_feeds', lambda session: {'pixel_values': np.zeros((2, 3), np.float32)})
    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        session = fused.cpu_session(tiny_onnx_export / 'visual.onnx', ort.SessionOptions)
    assert 'no sample to check a rewrite on' in caplog.text
    feeds = tower_feeds('visual.onnx', 2)
    exported = plain_session(str(tiny_onnx_export / 'visual.onnx')).run(None, feeds)[0]
    np.testing.assert_array_equal(session.run(None, feeds)[0], exported)  # the fused graph's differ in the last bits
    with caplog.at_level(logging.WARNING, logger=fused.__name__):
        to_quantize = fused.float_graph_to_quantize(tiny_onnx_export / 'visual.onnx')
    assert 'the rewritten graph was not checked' in caplog.text and 'quantizing it as exported' in caplog.text
    assert not _attention_nodes(to_quantize, 'MultiHeadAttention')
