"""CPU sessions of float32 graphs (CLIP towers, rerankers) rewritten at load, checked first: attention fused
(backends/onnx/attention.py) and the last operators run on the pooled rows only (backends/onnx/pooled_rows.py).
The int8 copies start from the same rewrites, checked the same way (`float_graph_to_quantize`).

A rewritten graph serves only after it has given the exported graph's answer on a sample input; one that
does not (or a rewrite that fails) is reported in the log and the graph as exported serves instead. The two
sessions are not held at once, so loading never needs the weights twice in memory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

from clipserve.backends.onnx.attention import fuse_attention
from clipserve.backends.onnx.pooled_rows import pool_early

# where a graph loaded from bytes finds its external data (the weights beside the exported file)
EXTERNAL_DATA_FOLDER = 'session.model_external_initializers_file_folder_path'
SAMPLE_ROWS = 2
SAMPLE_LENGTH = 8  # a sample's length along any other dimension the graph leaves open
PROVIDERS = ['CPUExecutionProvider']

logger = logging.getLogger(__name__)


def cpu_session(path: Path, make_options: Callable[[], ort.SessionOptions]) -> ort.InferenceSession:
    """The CPU session of the float32 graph at `path`: rewritten where a rewrite is recognised and checked."""
    original = _as_exported(path, make_options)
    try:
        rewritten = rewritten_graph(path)
    except Exception as e:  # a graph the onnx package cannot read or rewrite still serves as exported
        logger.warning('%s: not rewritten (%s: %s); serving the graph as exported', path.name, type(e).__name__, e)
        return original
    if rewritten is None:
        return original
    graph, done = rewritten
    feeds = sample_feeds(original)
    try:
        expected = original.run(None, feeds)
    except Exception as e:  # a sample this module cannot make for it (token ids past a small vocabulary)
        logger.warning('%s: no sample to check a rewrite on (%s); serving the graph as exported', path.name, e)
        return original
    del original
    options = make_options()
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(Path(path).parent))
    try:
        fused = ort.InferenceSession(graph, options, providers=PROVIDERS)
        answers = fused.run(None, feeds)
    except Exception as e:
        logger.warning(
            '%s: the rewritten graph did not run (%s: %s); serving the graph as exported',
            path.name,
            type(e).__name__,
            e,
        )
        return _as_exported(path, make_options)
    if not _same_answers(answers, expected):
        logger.warning(
            '%s: the rewritten graph answered differently on a sample; serving the graph as exported', path.name
        )
        return _as_exported(path, make_options)
    logger.info('%s: %s', path.name, done)
    return fused


def rewritten_graph(path: Path, projection_inside: bool = True) -> tuple[bytes, str] | None:
    """The graph at `path` with every rewrite that recognises it applied, serialized, and what was done; None
    when none does. Its weights stay where they are (external data beside `path`). `projection_inside`: as
    backends/onnx/attention.py's `fuse_attention` takes it."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    layers = fuse_attention(model, Path(path).parent, projection_inside)
    moved = pool_early(model)
    if not layers and not moved:
        return None
    fused_into = 'Attention' if projection_inside else 'MultiHeadAttention'
    done = [f"{layers} attention layers fused into onnxruntime's {fused_into}"] if layers else []
    if moved:
        done.append(f'{moved} operators of the last layer run on the pooled rows only')
    return model.SerializeToString(), '; '.join(done)


def float_graph_to_quantize(path: Path):
    """The float graph at `path` (an onnx ModelProto, weights loaded) for a quantizer to rewrite: with attention
    fused around its own in-projection and the last layer on the pooled rows, when that graph answers as the
    exported one on a sample; else as exported (logged)."""
    import onnx

    rewritten = rewritten_graph(path, projection_inside=False)
    if rewritten is None:
        return onnx.load(str(path))
    graph, done = rewritten
    options = ort.SessionOptions()
    try:
        exported = ort.InferenceSession(str(path), options, providers=PROVIDERS)
        feeds = sample_feeds(exported)
        expected = exported.run(None, feeds)
        del exported
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(Path(path).parent))
        answers = ort.InferenceSession(graph, options, providers=PROVIDERS).run(None, feeds)
    except Exception as e:  # no sample this module can make for it, or a rewrite onnxruntime cannot run
        logger.warning(
            '%s: the rewritten graph was not checked (%s: %s); quantizing it as exported',
            path.name,
            type(e).__name__,
            e,
        )
        return onnx.load(str(path))
    if not _same_answers(answers, expected):
        logger.warning('%s: the rewritten graph answered differently on a sample; quantizing it as exported', path.name)
        return onnx.load(str(path))
    logger.info('%s, before quantizing: %s', path.name, done)
    model = onnx.load_from_string(graph)
    onnx.load_external_data_for_model(model, str(Path(path).parent))
    return model


def _same_answers(answers: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    return all(np.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(answers, expected))


def _as_exported(path: Path, make_options: Callable[[], ort.SessionOptions]) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), make_options(), providers=PROVIDERS)


def sample_feeds(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """A small input for every input of `session`: seeded random floats, token ids, masks of ones, segment ids
    of zeros."""
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        shape = [SAMPLE_ROWS] + [dim if isinstance(dim, int) and dim > 0 else SAMPLE_LENGTH for dim in spec.shape[1:]]
        if 'float' in spec.type:
            dtype = np.float16 if 'float16' in spec.type else np.float32
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif 'mask' in spec.name or 'type' in spec.name:  # token_type_ids: segment 0 exists in every model
            fill = np.ones if 'mask' in spec.name else np.zeros
            feeds[spec.name] = fill(shape, dtype=np.int64 if 'int64' in spec.type else np.int32)
        else:  # token ids: small ones, inside any vocabulary
            ids = 1 + np.arange(int(np.prod(shape))).reshape(shape) % 100
            feeds[spec.name] = ids.astype(np.int64 if 'int64' in spec.type else np.int32)
    return feeds
