"""torch vs onnx items/s at batch 1, 8 and 32, for texts and images, in one run on this machine.

    .venv/bin/python -m benchmarks.backends [--model ViT-B-32::random] [--batches 1 8 32]

Model-only throughput (no Flow): the backends' own encode calls on preprocessed inputs. Texts are
~10-word captions (padding trimmed, as served); images are 224x224 pixel batches.
Prints a table, writes benchmarks/results/backends.json and backends.png.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

from benchmarks.common import items_per_second, machine, markdown_table, save, save_plot

CAPTIONS = [
    'a photo of a small brown dog running on the beach at sunset',
    'two people riding bicycles along a busy city street in the rain',
    'a bowl of fresh fruit on a wooden kitchen table near a window',
    'an old red tractor parked in a green field under a cloudy sky',
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--batches', type=int, nargs='+', default=[1, 8, 32])
    parser.add_argument('--seconds', type=float, default=3.0)
    args = parser.parse_args()

    from clipserve.backends import BackendOptions, create_backend
    from clipserve.backends.onnx.export import export_onnx
    from clipserve.models.tokenizer import Tokenizer

    options = BackendOptions(device='cpu')
    workdir = tempfile.TemporaryDirectory(prefix='clipserve-bench-')  # removed when the script ends
    folder = workdir.name
    export_onnx(args.model, folder)
    backends = {
        'torch': create_backend('torch', args.model, options),
        'onnx': create_backend('onnx', args.model, options, model_path=folder),
    }
    size = backends['torch'].image_size
    rng = np.random.default_rng(0)
    rows, results = [], []
    for batch in args.batches:
        pixels = rng.normal(size=(batch, 3, size, size)).astype(np.float32)
        tokens = Tokenizer()([CAPTIONS[i % len(CAPTIONS)] for i in range(batch)])
        for kind in ('texts', 'images'):
            rate = {}
            for name, backend in backends.items():
                if kind == 'texts':
                    fn = lambda b=backend: b.encode_texts(tokens.input_ids, tokens.attention_mask)  # noqa: E731
                else:
                    fn = lambda b=backend: b.encode_images(pixels)  # noqa: E731
                rate[name] = items_per_second(fn, batch, min_seconds=args.seconds)
            results.append({'kind': kind, 'batch': batch, **rate})
            rows.append(
                [kind, batch, f'{rate["torch"]:.2f}', f'{rate["onnx"]:.2f}', f'{rate["onnx"] / rate["torch"]:.2f}x']
            )
    info = machine()
    print(f'\n{args.model}, model only, {info["cpu"]}, {info["cores"]} cores, {info["when"]}\n')
    print(markdown_table(['input', 'batch', 'torch items/s', 'onnx items/s', 'onnx / torch'], rows))
    path = save('backends', {'model': args.model, 'machine': info, 'results': results})

    def draw(axes):
        for ax, kind in zip(axes, ('texts', 'images')):
            cells = [r for r in results if r['kind'] == kind]
            x = np.arange(len(cells))
            ax.bar(x - 0.2, [c['torch'] for c in cells], 0.4, label='torch')
            ax.bar(x + 0.2, [c['onnx'] for c in cells], 0.4, label='onnx')
            ax.set_xticks(x, [f'batch {c["batch"]}' for c in cells])
            ax.set_title(f'{kind} ({args.model})')
            ax.set_ylabel('items/s')
            ax.legend()

    save_plot(path, draw, ncols=2, figsize=(9, 3.5))
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
