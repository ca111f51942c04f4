"""Short texts on the onnx backend: the Flow against the model alone at its best batch and against FastEmbed.

Used by serving.py, inside its bracketed windows for (onnx, short texts): besides the model alone at the
clients' batch (the baseline) and the Flow with 1 and 4 clients, the same rounds measure the model alone
at larger batches and FastEmbed (fastembed_text.py, in a process of its own) on the same export, each
window between two baseline windows. If the model's rate still rises from batch 32 to 64, batch 128 is
measured after those rounds, bracketed the same way. The best batch is the one with the highest median
bracketed ratio; Flow(4) / model@best and Flow(4) / FastEmbed are quotients of such ratios (each measure
over the baseline around it), so a drift in the machine's speed between their windows cancels.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import bracketed, markdown_table, sustained_rate

ROOT = Path(__file__).resolve().parents[1]
SWEEP = (16, 32, 64)  # batches beyond the clients' (8) measured in the main rounds
NEXT = 128  # measured too when the rate still rises from 32 to 64
FASTEMBED_BATCH = 256
GOALS = {'flow_4_vs_model_best': 0.85, 'flow_4_vs_fastembed': 1.0}  # issue 30, "small requests merged"


def model_only(backend, tokenizer, text: str, batch: int):
    """One call: tokenize `batch` copies of `text` and encode them, as serving.py's model-only window does."""
    return lambda: backend.encode_texts(tokenizer([text] * batch).input_ids)


class RateProcess:
    """A benchmark script in a process of its own, started (and checked against clipserve) once, then asked for
    one sustained rate per window: its threads share nothing with the caller's (fastembed_text.py --serve)."""

    def __init__(self, args: list[str], key: str):
        self.args, self.key = args, key
        self.check: dict = {}

    def __enter__(self) -> RateProcess:
        self.stderr = tempfile.TemporaryFile(mode='w+')
        self.proc = subprocess.Popen(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=ROOT
        )
        self.check = self._answer()
        return self

    def rate(self, seconds: float) -> float:
        self.proc.stdin.write(f'{seconds}\n')
        self.proc.stdin.flush()
        return self._answer()[self.key]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        try:
            return json.loads(line)
        except ValueError:
            self.proc.wait(timeout=30)
            self.stderr.seek(0)
            raise RuntimeError(
                f'{" ".join(self.args[1:3])} failed ({self.proc.returncode}):\n{self.stderr.read()[-3000:]}'
            ) from None

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()


class FastEmbedProcess(RateProcess):
    """fastembed_text.py --serve on an export: FastEmbed's TextEmbedding, texts/s per window."""

    def __init__(self, export_dir: str, text: str, batch: int = FASTEMBED_BATCH):
        args = [sys.executable, '-m', 'benchmarks.fastembed_text', export_dir, '--text', text, '--batch', str(batch)]
        super().__init__([*args, '--serve'], 'texts_per_s')
        self.batch = batch


class FastEmbedImagesProcess(RateProcess):
    """fastembed_images.py --serve on an export and a folder of JPEGs: FastEmbed's ImageEmbedding, images/s."""

    def __init__(self, export_dir: str, image_dir: str):
        args = [sys.executable, '-m', 'benchmarks.fastembed_images', export_dir, image_dir, '--serve']
        super().__init__(args, 'images_per_s')


def fastembed(export_dir: str, text: str):
    """A FastEmbedProcess on the export, or (fastembed not installed) a context that yields None."""
    if importlib.util.find_spec('fastembed') is None:
        print('(fastembed, in the `bench` extra, is not installed: no FastEmbed row)')
        return contextlib.nullcontext()
    return FastEmbedProcess(export_dir, text)


def measures(backend, tokenizer, text: str, seconds: float, fastembed: FastEmbedProcess | None) -> dict:
    """The windows added to the bracketed rounds: the model alone per batch in SWEEP, and FastEmbed."""
    found = {f'batch {b}': _window(backend, tokenizer, text, b, seconds) for b in SWEEP}
    if fastembed is not None:
        found['fastembed'] = lambda: fastembed.rate(seconds)
    return found


def _window(backend, tokenizer, text, batch, seconds):
    return lambda: sustained_rate(model_only(backend, tokenizer, text, batch), batch, seconds)


def summary(ratios: dict, rates: dict, baseline, backend, tokenizer, text: str, batch: int, args, fastembed) -> dict:
    """The comparison from the main rounds' medians (plus batch 128's own rounds when the rate still rose)."""
    ratios, rates = dict(ratios), dict(rates)
    ratios[f'batch {batch}'], rates[f'batch {batch}'] = 1.0, rates['baseline']
    last, before = f'batch {SWEEP[-1]}', f'batch {SWEEP[-2]}'
    if ratios[last] > ratios[before]:
        more, values = bracketed(
            baseline, {f'batch {NEXT}': _window(backend, tokenizer, text, NEXT, args.seconds)}, args.rounds
        )
        ratios |= more
        rates[f'batch {NEXT}'] = values[f'batch {NEXT}']
    sizes = sorted(int(k.split()[1]) for k in ratios if str(k).startswith('batch '))
    best = max(sizes, key=lambda b: ratios[f'batch {b}'])
    result = {
        'backend': 'onnx',
        'workload': 'short texts',
        'clients_batch': batch,
        'model_batches': {
            str(b): {'texts_per_s': rates[f'batch {b}'], 'vs_batch_8': ratios[f'batch {b}']} for b in sizes
        },
        'model_at_8': rates['baseline'],
        'model_best_batch': best,
        'model_at_best': rates[f'batch {best}'],
        'model_best_vs_8': ratios[f'batch {best}'],
        'flow_1_client': rates[1],
        'flow_4_clients': rates[4],
        'flow_1_vs_model_8': ratios[1],
        'flow_4_vs_model_8': ratios[4],
        'flow_4_vs_model_best': ratios[4] / ratios[f'batch {best}'],
    }
    if fastembed is not None:
        result |= {
            'fastembed': rates['fastembed'],
            'fastembed_batch': fastembed.batch,
            'fastembed_vs_model_8': ratios['fastembed'],
            'flow_4_vs_fastembed': ratios[4] / ratios['fastembed'],
            'fastembed_min_cosine': fastembed.check['min_cosine'],
            'fastembed_tokens_equal': fastembed.check['tokens_equal'],
        }
    return result


def table(r: dict) -> str:
    """The comparison's table, and the sweep behind model@best."""
    fast = 'fastembed' in r
    row = [
        f'{r["model_at_8"]:.1f}',
        f'{r["model_at_best"]:.1f} ({r["model_best_batch"]}; {r["model_best_vs_8"]:.2f}x)',
        f'{r["flow_1_client"]:.1f} ({r["flow_1_vs_model_8"]:.2f}x)',
        f'{r["flow_4_clients"]:.1f} ({r["flow_4_vs_model_8"]:.2f}x)',
        f'{r["fastembed"]:.1f} ({r["fastembed_vs_model_8"]:.2f}x)' if fast else 'not installed',
        f'{r["flow_4_vs_model_best"]:.2f}',
        f'{r["flow_4_vs_fastembed"]:.2f}' if fast else '-',
    ]
    headers = [
        'model@8 /s',
        'model@best /s (batch; x model@8)',
        'Flow(1) /s',
        'Flow(4) /s',
        f'FastEmbed@{r.get("fastembed_batch", FASTEMBED_BATCH)} /s',
        'Flow(4) / model@best',
        'Flow(4) / FastEmbed',
    ]
    sweep = ', '.join(f'{b}: {v["texts_per_s"]:.1f} ({v["vs_batch_8"]:.2f}x)' for b, v in r['model_batches'].items())
    lines = [
        f'\nShort texts, onnx fp32: clients send {r["clients_batch"]} texts per request\n',
        markdown_table(headers, [row]),
        '(rates: medians of their windows; x: median bracketed ratio to model@8 around each window; the two '
        'ratio columns are quotients of those, so they need not equal the quotients of the rates)',
        f'model alone by batch (texts/s, x batch 8): {sweep}',
        f'goals (issue 30): Flow(4) / model@best >= {GOALS["flow_4_vs_model_best"]}, '
        f'Flow(4) / FastEmbed >= {GOALS["flow_4_vs_fastembed"]}',
    ]
    if fast:
        lines.append(
            f'FastEmbed in its own process on the same textual.onnx, batch {r["fastembed_batch"]}: token ids '
            f'{"equal" if r["fastembed_tokens_equal"] else "DIFFER"}, min cosine to clipserve {r["fastembed_min_cosine"]:.6f}'
        )
    return '\n'.join(lines)
