"""Cross-encoder rerankers without a Flow: pairs tokenized exactly as transformers' tokenizer pairs them (both
model kinds, both truncation sides), scores equal to transformers' model on torch and onnx, the same pair scoring
the same whatever shares its batch, int8 measured against fp32 before it serves, and checkpoints that are not
one-label rerankers refused by name. Tiny random-weights checkpoints built here (tests/transformers_folders.py)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from clipserve.backends import create_cross_encoder
from clipserve.backends.cross_encoder import RerankOptions
from clipserve.engine.rerank import RerankPipeline
from clipserve.errors import BackendUnavailableError, InvalidDocumentError, UnknownModelError
from clipserve.models.cross_encoder import PairTokenizer, resolve_cross_encoder

from ..transformers_folders import cross_encoder_checkpoint

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

QUERY = 'which city is the capital of france?'
DOCUMENTS = ['paris', 'the capital of france is paris, a city on the seine ' * 4, 'a cat', 'berlin is in germany']


@pytest.fixture(scope='module', params=['xlm-roberta', 'bert'])
def checkpoint(request, tmp_path_factory):
    return cross_encoder_checkpoint(tmp_path_factory.mktemp(request.param) / 'reranker', request.param)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path_factory.getbasetemp() / 'cache'))


def reference(folder, documents, max_length=None, side='right'):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.truncation_side = side
    inputs = tokenizer(
        [QUERY] * len(documents),
        documents,
        truncation=True,
        padding=True,
        max_length=max_length or 64,
        return_tensors='np',
    )
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits[:, 0].numpy()
    return inputs, logits


@pytest.mark.parametrize('max_length, side', [(None, 'right'), (12, 'right'), (12, 'left')])
def test_pairs_are_transformers_own(checkpoint, max_length, side):
    pairs = PairTokenizer(resolve_cross_encoder(str(checkpoint)))(QUERY, DOCUMENTS, max_length, side)
    want, _ = reference(checkpoint, DOCUMENTS, max_length, side)
    assert np.array_equal(pairs.input_ids, want['input_ids']) and np.array_equal(
        pairs.attention_mask, want['attention_mask']
    )
    if 'token_type_ids' in want:
        assert np.array_equal(pairs.token_type_ids, want['token_type_ids'])
    assert list(pairs.truncated) == [
        bool(n) for n in (want['attention_mask'].sum(1) >= (max_length or 64)) & pairs.truncated
    ]


@pytest.mark.parametrize('backend', ['torch', 'onnx'])
def test_scores_equal_transformers_and_do_not_depend_on_the_batch(checkpoint, backend):
    encoder = create_cross_encoder(backend, resolve_cross_encoder(str(checkpoint)), RerankOptions(dtype='fp32'))
    pipeline = RerankPipeline(encoder, minibatch_size=3)
    try:
        _, want = reference(checkpoint, DOCUMENTS)
        scores = pipeline.score(QUERY, DOCUMENTS)
        assert scores.raw == pytest.approx(want, abs=1e-5)
        assert scores.relevance == pytest.approx(1 / (1 + np.exp(-want)), abs=1e-5)
        alone = [pipeline.score(QUERY, [d]).raw[0] for d in DOCUMENTS]
        assert alone == pytest.approx(scores.raw, abs=1e-5)
        assert scores.truncated == 1 and scores.tokens > 0
        with pytest.raises(InvalidDocumentError, match=r"document 'd1': with the query it is longer than 16 tokens"):
            pipeline.score(QUERY, DOCUMENTS, max_length=16, truncate=False, names=['d0', 'd1', 'd2', 'd3'])
    finally:
        pipeline.close()


def test_onnx_fp32_runs_the_last_layer_on_the_first_token_only(checkpoint, caplog):
    """The scores above come from the rewritten graph: the last layer runs on the row the head reads."""
    with caplog.at_level(logging.INFO, logger='clipserve.backends.onnx.fused'):
        create_cross_encoder('onnx', resolve_cross_encoder(str(checkpoint)), RerankOptions(dtype='fp32'))
    assert 'operators of the last layer run on the pooled rows only' in caplog.text


def test_torch_bf16_on_a_cpu_packs_its_linear_layers_and_scores_as_transformers_bf16(checkpoint, monkeypatch, caplog):
    """Packed where oneDNN computes bf16 (backends/torch/packed_weights.py): the same products, so the scores
    of transformers' own bf16 model; a packed model answering its sample differently stays as it was."""
    from clipserve.backends.torch import packed_weights

    spec = resolve_cross_encoder(str(checkpoint))
    with caplog.at_level(logging.INFO, logger=packed_weights.__name__):
        encoder = create_cross_encoder('torch', spec, RerankOptions(dtype='bf16'))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if not packed_weights.onednn_computes_bf16():  # an AVX2 CPU: bf16 products run outside oneDNN
        assert encoder.packed_linears == 0
        return
    assert encoder.packed_linears == len(linears) > 0 and 'linear layers laid out for oneDNN' in caplog.text
    inputs, _ = reference(checkpoint, DOCUMENTS)
    with torch.inference_mode():
        want = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits[:, 0].float().numpy()
    np.testing.assert_array_equal(encoder.score(*(inputs[name] for name in spec.input_names)), want)

    plain = packed_weights.PackedLinear.forward
    monkeypatch.setattr(packed_weights.PackedLinear, 'forward', lambda self, x: plain(self, x) * 1.5)
    with caplog.at_level(logging.INFO, logger=packed_weights.__name__):
        broken = create_cross_encoder('torch', spec, RerankOptions(dtype='bf16'))
    assert broken.packed_linears == 0 and 'left unpacked' in caplog.text
    monkeypatch.undo()
    assert not any(isinstance(m, packed_weights.PackedLinear) for m in broken.model.modules())
    np.testing.assert_array_equal(broken.score(*(inputs[name] for name in spec.input_names)), want)


def test_int8_is_measured_against_fp32_before_it_serves(checkpoint, monkeypatch):
    """int8 that drifts past the bound is refused with the figures, served when forced. The bound is set below
    any drift here: the tiny random model's int8 (its first block and last layer in float) lands near the real
    bound, where whether its best three keep their order is a coin toss."""
    from clipserve.backends import rerank_check
    from clipserve.serving.replica.reranker import CrossEncoderRanker

    monkeypatch.delenv('CLIPSERVE_INT8_FORCE', raising=False)
    monkeypatch.setattr(rerank_check, 'MAX_SCORE_DIFF', 1e-6)
    with pytest.raises(
        BackendUnavailableError, match=r'dtype int8 for this reranker is refused.*max relevance difference'
    ):
        CrossEncoderRanker(name=str(checkpoint), backend='onnx', dtype='int8')
    monkeypatch.setenv('CLIPSERVE_INT8_FORCE', '1')
    ranker = CrossEncoderRanker(name=str(checkpoint), backend='onnx', dtype='int8')
    try:
        assert 'SERVED ANYWAY' in ranker.precision and ranker.encoder.dtype == 'int8'
    finally:
        ranker.close()


def test_checkpoints_that_are_not_one_label_rerankers_are_refused_by_name(checkpoint, tmp_path):
    import shutil

    for edit, words in (
        (lambda c: c.update(num_labels=3, id2label={'0': 'a', '1': 'b', '2': 'c'}), 'classifies into 3 labels'),
        (lambda c: c.update(architectures=['XLMRobertaModel']), 'is not a cross-encoder'),
    ):
        folder = tmp_path / words.split()[0]
        shutil.copytree(checkpoint, folder)
        config = json.loads((folder / 'config.json').read_text())
        edit(config)
        (folder / 'config.json').write_text(json.dumps(config))
        with pytest.raises(UnknownModelError, match=words):
            resolve_cross_encoder(str(folder))
    with pytest.raises(Exception, match='is not a reranker checkpoint folder'):
        resolve_cross_encoder(str(tmp_path / 'nothing-here'))


@pytest.mark.parametrize('native', ['1', '0'])
def test_auto_is_bf16_where_the_cpu_has_it_and_checked_against_fp32(checkpoint, monkeypatch, native):
    """auto picks bf16 on a CPU with native bf16 (forced here either way with CLIPSERVE_CPU_BF16), measured
    against fp32 at start: kept when it passes, replaced by fp32 when it fails; fp32 elsewhere."""
    from clipserve.backends.precision import cpu_bf16
    from clipserve.serving.replica.reranker import CrossEncoderRanker

    monkeypatch.setenv('CLIPSERVE_CPU_BF16', native)
    monkeypatch.delenv('CLIPSERVE_INT8_FORCE', raising=False)
    cpu_bf16.cache_clear()
    try:
        ranker = CrossEncoderRanker(name=str(checkpoint))
        try:
            if native == '1':
                assert 'bf16' in ranker.precision and ranker.encoder.dtype in ('bf16', 'fp32')
                assert (ranker.encoder.dtype == 'fp32') == ranker.precision.startswith('fp32: auto chose bf16')
            else:
                assert ranker.precision == 'fp32' and ranker.encoder.dtype == 'fp32'
        finally:
            ranker.close()
    finally:
        cpu_bf16.cache_clear()
