"""What the start-up warm-up buys: the first request's latency with and without it.

    .venv/bin/python -m benchmarks.warmup [--model ViT-B-32::random] [--backend torch] [--rounds 3]

Each measurement is a fresh process (a CLIPEncoder built in-process, as a replica builds it): the
warm-up's own cost, then the latency of the first four requests (one text and one 320x240 image
each). Rounds alternate with and without the warm-up, so machine noise hits both. Prints a table,
writes benchmarks/results/warmup.json and .png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.common import machine, markdown_table, save, save_plot

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = 4

CHILD = (
    """
import json, sys, time
import numpy as np
from docarray import Document, DocumentArray
from clipserve import CLIPEncoder
from clipserve.serving.replica.executors import CLIPExecutorBase
model, backend, warm = sys.argv[1], sys.argv[2], sys.argv[3] == '1'
if not warm:
    CLIPExecutorBase._warm_up = lambda self: 0.0
encoder = CLIPEncoder(name=model, backend=backend)
rng = np.random.default_rng(1)
latencies = []
for _ in range(%d):
    docs = DocumentArray([Document(text='a photo of a dog on the beach'),
                          Document(tensor=rng.integers(0, 255, (240, 320, 3), dtype=np.uint8))])
    started = time.perf_counter()
    encoder.encode(docs)
    latencies.append(time.perf_counter() - started)
print(json.dumps({'warmup_seconds': encoder.warmup_seconds, 'latencies': latencies}))
"""
    % REQUESTS
)


def measure(model: str, backend: str, warm: bool) -> dict:
    result = subprocess.run(
        [sys.executable, '-c', CHILD, model, backend, '1' if warm else '0'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1800,
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--backend', default='torch')
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args()
    runs = {'with warm-up': [], 'without': []}
    for _ in range(args.rounds):
        for label, warm in (('with warm-up', True), ('without', False)):
            runs[label].append(measure(args.model, args.backend, warm))
    rows = []
    for label, measured in runs.items():
        latencies = np.array([m['latencies'] for m in measured]) * 1000  # rounds x requests, ms
        rows.append(
            {
                'variant': label,
                'warmup_ms': float(np.median([m['warmup_seconds'] for m in measured]) * 1000),
                'request_ms': [float(v) for v in np.median(latencies, axis=0)],
            }
        )
    info = machine()
    print(
        f'\n{args.model} on {args.backend}, {info["cpu"]}, load {info["load_avg"]:.2f}, {info["when"]}; '
        f'median of {args.rounds} fresh processes each\n'
    )
    print(
        markdown_table(
            ['', 'warm-up ms'] + [f'request {i + 1} ms' for i in range(REQUESTS)],
            [[r['variant'], f'{r["warmup_ms"]:.0f}'] + [f'{v:.0f}' for v in r['request_ms']] for r in rows],
        )
    )
    path = save('warmup', {'model': args.model, 'backend': args.backend, 'machine': info, 'rows': rows})

    def draw(ax):
        x = np.arange(REQUESTS)
        for offset, row in zip((-0.2, 0.2), rows):
            ax.bar(x + offset, row['request_ms'], 0.4, label=row['variant'])
        ax.set_xticks(x, [f'request {i + 1}' for i in range(REQUESTS)])
        ax.set_ylabel('ms (one text + one image)')
        ax.legend()

    save_plot(path, draw)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
