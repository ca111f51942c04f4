"""A reranker on ONNX Runtime: the checkpoint exported once (`reranker.onnx`, dynamic batch and sequence), its
tokenizer files beside it, so an export folder serves without torch or transformers.

    python -m clipserve export reranker CHECKPOINT OUT_DIR       (needs the torch extra, once)

Without an export folder (`model_path`) the checkpoint is exported on first use into the cache (needs torch
then), under a file lock so replicas starting together export once. `dtype: int8` quantizes the linear layers
as the encoders' int8 copies are (backends/onnx/int8.py), once, into the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
from filelock import FileLock

from clipserve.backends.cross_encoder import CrossEncoder, RerankOptions, pick_dtype
from clipserve.backends.onnx import fused
from clipserve.models.cache import cache_dir
from clipserve.models.cross_encoder import CONFIG_FILE, TOKENIZER_CONFIG, TOKENIZER_FILE, CrossEncoderSpec, read_spec

GRAPH_FILE = 'reranker.onnx'
COPIED = (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG, 'special_tokens_map.json')
TOLERANCE = 1e-4
INT8_FORMAT = 3

logger = logging.getLogger(__name__)


class OnnxCrossEncoder(CrossEncoder):
    name = 'onnx'

    def __init__(self, spec: CrossEncoderSpec, options: RerankOptions = RerankOptions(), model_path: str | None = None):
        super().__init__()
        self.device = options.device or 'cpu'
        self.dtype = pick_dtype('onnx', self.device, options.dtype)
        folder = Path(model_path) if model_path else cached_export(spec)
        self.spec = replace(read_spec(spec.name, folder), name=spec.name)
        graph = folder / GRAPH_FILE
        if self.dtype == 'int8':
            graph = int8_graph(graph)
        make_options = partial(_session_options, options.num_threads)
        if self.device.startswith('cuda'):
            providers = ['CUDAExecutionProvider', 'CPUExecutionProvider']
            self.session = ort.InferenceSession(str(graph), make_options(), providers=providers)
        elif self.dtype == 'fp32':
            self.session = fused.cpu_session(graph, make_options)  # the last layer on the first token's row only
        else:
            self.session = ort.InferenceSession(str(graph), make_options(), providers=fused.PROVIDERS)
        self._inputs = [i.name for i in self.session.get_inputs()]

    def _score(self, *arrays: np.ndarray) -> np.ndarray:
        feeds = {name: a for name, a in zip(self.spec.input_names, arrays) if name in self._inputs}
        return self.session.run(None, feeds)[0]


def _session_options(num_threads: int | None) -> ort.SessionOptions:
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session_options.inter_op_num_threads = 1
    session_options.enable_cpu_mem_arena = False  # pairs of every length: give activations back after a pass
    session_options.enable_mem_pattern = False
    session_options.add_session_config_entry('session.force_spinning_stop', '1')
    if num_threads:
        session_options.intra_op_num_threads = num_threads
    return session_options


def cached_export(spec: CrossEncoderSpec) -> Path:
    """The export of `spec`'s checkpoint in the cache, made now if needed (keyed by its weights' files)."""
    digest = hashlib.sha256(str(spec.folder.resolve()).encode())
    for path in sorted(spec.folder.glob('*')):
        if path.is_file():
            digest.update(f'{path.name}:{path.stat().st_size}:{path.stat().st_mtime_ns}'.encode())
    target = cache_dir() / 'onnx-rerankers' / f'{spec.folder.name}-{digest.hexdigest()[:16]}'
    if (target / GRAPH_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + '.lock'):
        if not (target / GRAPH_FILE).is_file():
            work = Path(tempfile.mkdtemp(prefix=f'.{target.name}-', dir=target.parent))
            try:
                export_cross_encoder(spec, work)
                os.rename(work, target)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return target


def export_cross_encoder(spec: CrossEncoderSpec, out: Path, opset: int = 18) -> float:
    """Export the checkpoint to `out` (reranker.onnx + its tokenizer files) and check it against PyTorch on
    fresh pairs of another batch and length; the largest logit difference (an ExportError above TOLERANCE)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from clipserve.backends.onnx.export import ExportError, export_graph
    from clipserve.models.cross_encoder import PairTokenizer

    out.mkdir(parents=True, exist_ok=True)
    # eager attention: the SDPA path exports to a graph ONNX Runtime runs at two thirds of PyTorch's speed on
    # long pairs (256 tokens), the eager one at PyTorch's (benchmarks/rerank.py)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(spec.folder), dtype=torch.float32, attn_implementation='eager'
    ).eval()

    class Logits(torch.nn.Module):  # named inputs: torch.export names the graph's inputs after them
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0]

    class SegmentLogits(Logits):
        def forward(self, input_ids, attention_mask, token_type_ids):
            inputs = {'input_ids': input_ids, 'attention_mask': attention_mask, 'token_type_ids': token_type_ids}
            return self.model(**inputs).logits[:, 0]

    module = (SegmentLogits if 'token_type_ids' in spec.input_names else Logits)()

    tokenizer = PairTokenizer(spec)
    sample = tokenizer('a query', ['a document ' * spec.max_length, 'short'])  # the longest shape: the export's bound
    args = tuple(torch.from_numpy(a) for a in sample.rows(slice(None)))
    axes = {name: {0: 'batch', 1: 'sequence'} for name in spec.input_names}
    with torch.no_grad():
        export_graph(module, args, out / GRAPH_FILE, list(spec.input_names), 'logits', axes, opset, True)
    for name in COPIED:
        if (spec.folder / name).is_file():
            shutil.copyfile(spec.folder / name, out / name)
    check = tokenizer('which city is the capital?', ['paris', 'the capital of france is paris, a city', 'x y z'])
    session = ort.InferenceSession(str(out / GRAPH_FILE), providers=['CPUExecutionProvider'])
    got = session.run(None, dict(zip(spec.input_names, check.rows(slice(None)))))[0]
    with torch.no_grad():
        want = module(*[torch.from_numpy(a) for a in check.rows(slice(None))]).numpy()
    diff = float(np.abs(got - want).max())
    if not diff <= TOLERANCE:
        raise ExportError(f'{GRAPH_FILE} differs from PyTorch by {diff:.2e} (> {TOLERANCE:g}); export rejected')
    (out / 'clipserve-reranker.json').write_text(
        json.dumps({'source': str(spec.name), 'max_abs_diff': diff, 'opset': opset})
    )
    logger.info('exported %s to %s: max |onnxruntime - torch| = %.2e', spec.name, out, diff)
    return diff


def int8_graph(graph: Path) -> Path:
    """The int8 copy of a reranker graph (linear layers quantized as the encoders' are), made once."""
    from clipserve.backends.onnx.copies import converted_copy
    from clipserve.backends.onnx.int8 import quantize_int8, weight_bits

    bits = weight_bits()
    return converted_copy(graph, f'int8-w{bits}', lambda src, dst: quantize_int8(src, dst, bits), INT8_FORMAT)
