"""Reranking speed: pairs per second for one query and 100 candidates, pairs of 64 and 256 tokens, clipserve's
reranker in process (engine/rerank.py: pairs sorted by length, minibatches trimmed to their longest) on torch
fp32 / bf16 and onnx fp32 / int8, against sentence-transformers' CrossEncoder in process (its own batching, 32
pairs a batch), on the same random-weights checkpoint, in one run. Each rate is a ratio to CrossEncoder measured
just before and just after it (common.bracketed: the machine's drift cancels).

    python -m benchmarks.rerank                  # ms-marco-MiniLM-L-6's shape (BERT, 6 x 384)
    python -m benchmarks.rerank --size base      # bge-reranker-base's shape (XLM-R, 12 x 768)

Random weights: speed only (and int8's drift from fp32 on them, which says nothing of a trained model's).
Prints a table, writes benchmarks/results/rerank.json and a bar plot next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import plots
from benchmarks.common import bracketed, machine, markdown_table, save

SIZES = {  # name: (model type, hidden, layers, heads, intermediate, vocab)
    'minilm': ('bert', 384, 6, 12, 1536, 30522),
    'base': ('xlm-roberta', 768, 12, 12, 3072, 250002),
}
CANDIDATES = 100
QUERY_WORDS = 12


def make_checkpoint(folder: Path, size: str) -> Path:
    """A reranker of `size`'s shape with random weights, and a word-level tokenizer of its vocabulary (each
    word one token, so pair lengths are exact)."""
    import torch
    import transformers as t
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    kind, hidden, layers, heads, intermediate, vocab_size = SIZES[size]
    folder.mkdir(parents=True, exist_ok=True)
    specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]'] if kind == 'bert' else ['<s>', '<pad>', '</s>', '<unk>']
    vocab = {token: i for i, token in enumerate(specials)}
    vocab.update({f'w{i}': len(specials) + i for i in range(min(vocab_size, 30000) - len(specials))})
    unk = specials[1] if kind == 'bert' else specials[3]
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if kind == 'bert':
        tokenizer.post_processor = processors.TemplateProcessing(
            single='[CLS] $A [SEP]', pair='[CLS] $A [SEP] $B:1 [SEP]:1', special_tokens=[('[CLS]', 2), ('[SEP]', 3)]
        )
        pad, config = '[PAD]', {'model_input_names': ['input_ids', 'token_type_ids', 'attention_mask']}
    else:
        tokenizer.post_processor = processors.RobertaProcessing(('</s>', 2), ('<s>', 0))
        pad, config = '<pad>', {}
    tokenizer.save(str(folder / 'tokenizer.json'))
    config.update(tokenizer_class='PreTrainedTokenizerFast', model_max_length=512, pad_token=pad, unk_token=unk)
    (folder / 'tokenizer_config.json').write_text(json.dumps(config))
    shape = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        vocab_size=vocab_size,
        num_labels=1,
    )
    if kind == 'bert':
        model_config = t.BertConfig(max_position_embeddings=512, type_vocab_size=2, **shape)
        model = t.BertForSequenceClassification
    else:
        model_config = t.XLMRobertaConfig(max_position_embeddings=514, type_vocab_size=1, pad_token_id=1, **shape)
        model = t.XLMRobertaForSequenceClassification
    torch.manual_seed(0)
    model(model_config).save_pretrained(folder)
    return folder


def pairs_of(tokens: str, seed: int) -> tuple[str, list[str]]:
    """A query of QUERY_WORDS words and CANDIDATES documents such that each pair is `tokens` tokens long
    (`mixed`: lengths drawn uniformly from 24 to 256, as retrieved passages vary)."""
    rng = np.random.default_rng(seed)
    words = lambda n: ' '.join(f'w{i}' for i in rng.integers(0, 29000, n))  # noqa: E731
    lengths = rng.integers(24, 257, CANDIDATES) if tokens == 'mixed' else np.full(CANDIDATES, int(tokens))
    return words(QUERY_WORDS), [words(int(n) - QUERY_WORDS - 3) for n in lengths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--size', default='minilm', choices=sorted(SIZES))
    parser.add_argument(
        '--lengths', default='64,256,mixed', help='pair lengths in tokens, or mixed (default %(default)s)'
    )
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=3.0, help='per measure')
    args = parser.parse_args()
    os.environ.setdefault('CLIPSERVE_INT8_FORCE', '1')  # random weights drift in int8: measured, not served

    import torch
    from sentence_transformers import CrossEncoder

    from clipserve.backends import create_cross_encoder
    from clipserve.backends.cpu_features import cpu_features
    from clipserve.backends.cross_encoder import RerankOptions
    from clipserve.engine.rerank import RerankPipeline
    from clipserve.models.cross_encoder import resolve_cross_encoder

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    work = Path(tempfile.mkdtemp(prefix='clipserve-rerank-bench-'))
    os.environ.setdefault('CLIPSERVE_CACHE', str(work / 'cache'))
    folder = make_checkpoint(work / f'reranker-{args.size}', args.size)
    spec = resolve_cross_encoder(str(folder))
    features = cpu_features()
    variants = {'torch fp32': ('torch', 'fp32'), 'onnx fp32': ('onnx', 'fp32'), 'onnx int8': ('onnx', 'int8')}
    if features.native_bf16:
        variants['torch bf16'] = ('torch', 'bf16')
    pipelines = {
        name: RerankPipeline(create_cross_encoder(kind, spec, RerankOptions(dtype=dtype, num_threads=threads)), 32)
        for name, (kind, dtype) in variants.items()
    }
    reference = CrossEncoder(str(folder), device='cpu', max_length=512)
    results = {'machine': machine(), 'size': args.size, 'threads': threads, 'candidates': CANDIDATES, 'lengths': {}}
    for tokens in args.lengths.split(','):
        query, documents = pairs_of(tokens, seed=len(results['lengths']))
        pairs = [(query, d) for d in documents]
        want = np.asarray(reference.predict(pairs, batch_size=32, activation_fn=torch.nn.Identity()), dtype=np.float64)

        def rate(call) -> float:
            from benchmarks.common import sustained_rate

            return sustained_rate(call, CANDIDATES, args.seconds)

        baseline = lambda: rate(lambda: reference.predict(pairs, batch_size=32))  # noqa: E731
        measures = {name: (lambda p=p: rate(lambda: p.score(query, documents))) for name, p in pipelines.items()}
        ratios, values = bracketed(baseline, measures, args.rounds)
        drift = {name: float(np.abs(p.score(query, documents).raw - want).max()) for name, p in pipelines.items()}
        results['lengths'][tokens] = {
            'pairs_per_second': values,
            'ratio_to_crossencoder': ratios,
            'max_logit_diff': drift,
        }
    for pipeline in pipelines.values():
        pipeline.close()
    report(results, features.describe())


def report(results: dict, cpu: str) -> None:
    rows = []
    for tokens, r in results['lengths'].items():
        rows.append(
            [
                f'{tokens}',
                'CrossEncoder (sentence-transformers)',
                f'{r["pairs_per_second"]["baseline"]:.0f}',
                '1.00',
                '-',
            ]
        )
        for name in r['ratio_to_crossencoder']:
            rows.append(
                [
                    f'{tokens}',
                    f'clipserve {name}',
                    f'{r["pairs_per_second"][name]:.0f}',
                    f'{r["ratio_to_crossencoder"][name]:.2f}',
                    f'{r["max_logit_diff"][name]:.1e}',
                ]
            )
    print(
        f'\n{results["size"]} reranker (random weights), 1 query x {results["candidates"]} candidates, '
        f'{results["threads"]} threads, {cpu}'
    )
    print(markdown_table(['pair tokens', 'reranker', 'pairs/s', 'x CrossEncoder', 'max |logit - CrossEncoder|'], rows))
    path = save('rerank', results)

    plots.rerank(results, path)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
