"""Why small text passes run fewer texts a second: every pass reads all of the text tower's weights.

    .venv/bin/python -m benchmarks.pass_size [--model ViT-B-32::random] [--rounds 3] [--seconds 3]

Two measures, taken in turn in each round (medians over the rounds):
- the torch backend's text passes at its default precision (what `Model` and the default Flow run), one short
  caption repeated, at 1, 8, 16, 32 and 256 rows a pass: milliseconds a pass, texts a second, and each size's
  rate against 256 rows (the in-process default);
- the text tower's weight matrices alone, each multiplied by as many rows as one caption has tokens (and by
  four times as many), in float32, in bfloat16, and in bfloat16 laid out for oneDNN once (the torch backend's
  packed blocks on a CPU with native bf16; PyTorch's own bfloat16 product copies each weight into that layout
  on every call): one pass's matrix products. When their time follows the weights' bytes and hardly the rows,
  a small pass is bound by reading the weights from memory: a fixed cost a pass, which a neighbour's memory
  traffic slows, and which only more rows a pass (merged requests) or fewer weight bytes amortise.
Prints a table, writes benchmarks/results/pass_size.json and a plot.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from benchmarks import plots
from benchmarks.common import machine, markdown_table, save, sustained_rate

CAPTION = 'a photo of a small brown dog running on the beach'
ROWS = (1, 8, 16, 32, 256)


def per_call_ms(fn, seconds: float) -> float:
    """Milliseconds per call of `fn`, called back to back for `seconds` (after one warm-up call)."""
    return 1000 / sustained_rate(fn, 1, seconds)


def loaded_model(name: str):
    """The model as it loads, in float32: the backend's own bf16 blocks may be packed (opaque weights)."""
    from clipserve.models.names import parse_model_name
    from clipserve.models.registry import build_model, resolve

    return build_model(resolve(parse_model_name(name)), device='cpu', precision='fp32')


def text_weights(model) -> list:
    """The 2-d weight matrices of the text tower (open_clip's `transformer`); [] for other model families."""
    tower = getattr(model, 'transformer', None)
    if tower is None:
        return []
    return [p.detach() for name, p in tower.named_parameters() if p.ndim == 2 and name.endswith('weight')]


def weight_reads(weights: list, rows: int, kind: str) -> tuple:
    """(a function multiplying `rows` rows by every weight matrix as `kind` says, the matrices' megabytes)."""
    import torch

    from clipserve.backends.torch.packed_weights import PackedLinear

    dtype = torch.float32 if kind == 'float32' else torch.bfloat16
    cast = [w.to(dtype).contiguous() for w in weights]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]).to(dtype) for w in cast}
    if kind == 'bfloat16, packed':
        products = [(inputs[w.shape[1]], PackedLinear(w, None)) for w in cast]
    else:
        products = [(inputs[w.shape[1]], lambda x, w=w: torch.nn.functional.linear(x, w)) for w in cast]

    def run():
        with torch.inference_mode():
            for x, product in products:
                product(x)

    return run, sum(w.numel() * w.element_size() for w in cast) / 1e6


def measure(model, name: str, rounds: int, seconds: float) -> dict:
    from clipserve.backends.torch.packed_weights import onednn_computes_bf16

    backend = model.backend
    batch = backend.tokenizer([CAPTION] * max(ROWS))
    ids, tokens = np.asarray(batch.input_ids), int(np.asarray(batch.attention_mask)[0].sum())
    passes = {rows: (lambda rows=rows: backend.encode_texts(ids[:rows])) for rows in ROWS}
    weights = text_weights(loaded_model(name))
    kinds = ('float32', 'bfloat16') + (('bfloat16, packed',) if onednn_computes_bf16() else ())
    reads = {
        (kind, rows): weight_reads(weights, rows, kind) for kind in kinds for rows in (tokens, 4 * tokens) if weights
    }
    pass_ms = {rows: [] for rows in ROWS}
    read_ms = {key: [] for key in reads}
    for _ in range(rounds):
        for rows, fn in passes.items():
            pass_ms[rows].append(per_call_ms(fn, seconds))
        for key in read_ms:
            read_ms[key].append(per_call_ms(reads[key][0], seconds))
    ms = {rows: statistics.median(v) for rows, v in pass_ms.items()}
    rate = {rows: rows / ms[rows] * 1000 for rows in ROWS}
    result = {
        'tokens_per_caption': tokens,
        'passes': {
            str(rows): {'ms': ms[rows], 'texts_per_s': rate[rows], 'vs_256_rows': rate[rows] / rate[256]}
            for rows in ROWS
        },
        'weights': {},
    }
    for (name, rows), values in read_ms.items():
        mb, t = reads[(name, rows)][1], statistics.median(values)
        entry = result['weights'].setdefault(name, {'mb': mb})
        if rows == tokens:
            entry |= {'ms': t, 'gb_per_s': mb / t}
        else:
            entry['ms_4x_rows'] = t
    if read_ms:
        w = result['weights']
        result['bfloat16_vs_float32'] = {
            'time': w['bfloat16']['ms'] / w['float32']['ms'],
            'bytes': w['bfloat16']['mb'] / w['float32']['mb'],
        }
    return result


def table(r: dict) -> str:
    lines = [
        f'\n{r["model"]}, torch texts at {r["precision"]}, {r["tokens_per_caption"]} tokens a caption\n',
        markdown_table(
            ['rows a pass', 'ms a pass', 'texts/s', 'of 256 rows'],
            [
                [rows, f'{p["ms"]:.1f}', f'{p["texts_per_s"]:.1f}', f'{p["vs_256_rows"]:.2f}']
                for rows, p in r['passes'].items()
            ],
        ),
    ]
    if r['weights']:
        lines += [
            f"\nthe text tower's weight matrices times {r['tokens_per_caption']} rows (one pass's reads)\n",
            markdown_table(
                ['weights', 'MB', 'ms', 'GB/s read', f'ms, {4 * r["tokens_per_caption"]} rows'],
                [
                    [k, f'{v["mb"]:.0f}', f'{v["ms"]:.1f}', f'{v["gb_per_s"]:.1f}', f'{v["ms_4x_rows"]:.1f}']
                    for k, v in r['weights'].items()
                ],
            ),
            f'bfloat16 against float32: time {r["bfloat16_vs_float32"]["time"]:.2f}, '
            f'bytes {r["bfloat16_vs_float32"]["bytes"]:.2f}',
        ]
    return '\n'.join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=3.0, help='each window')
    args = parser.parse_args()

    from clipserve import Model

    with Model(args.model, backend='torch') as model:
        results = {
            'model': args.model,
            'precision': model.precision,
            'machine': machine(),
            **measure(model, args.model, args.rounds, args.seconds),
        }
    print(table(results))
    path = save('pass_size', results)
    plots.pass_size(results, path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
