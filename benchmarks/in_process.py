"""clipserve in process (`from clipserve import Model`) against FastEmbed in process, on the same ONNX export.

    .venv/bin/python -m benchmarks.in_process [--model ViT-B-32::random] [--export DIR] [--seconds 4] [--rounds 3]

Texts: FastEmbed's TextEmbedding (fastembed_text.py in a process of its own, `embed` of 256 copies of one
caption a call, pooling and normalisation off since the graph pools) is the baseline; each clipserve
configuration embeds the same 256 captions a call and is measured between two FastEmbed windows
(common.bracketed), so its ratio holds on a busy machine. Configurations: Model(backend='onnx') on the very
export FastEmbed runs, and Model(backend='torch') at its default precision. Images (generated 320x240 JPEGs
as bytes, decoded by the Model): clipserve's rates, bracketed against Model(backend='onnx') fp32; FastEmbed's
ImageEmbedding is not run (a custom image model needs a Hugging Face preprocessor config this script does not
write). Needs the `bench` extra (fastembed). Prints a table, writes benchmarks/results/in_process.json and
in_process.png.
"""

from __future__ import annotations

import argparse
import io
import tempfile

import numpy as np
from PIL import Image

from benchmarks import plots
from benchmarks.common import bracketed, machine, markdown_table, save, sustained_rate
from benchmarks.text_rates import FASTEMBED_BATCH, FastEmbedProcess

CAPTION = 'a photo of a small brown dog running on the beach'
IMAGES = 64  # per call


def jpegs(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        y, x = np.mgrid[0:240, 0:320]
        base = np.stack([x * 255 / 319, y * 255 / 239, (x + y) % 256], axis=-1) + rng.normal(0, 25, (240, 320, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buffer, format='JPEG', quality=90)
        out.append(buffer.getvalue())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--export', help='an export of --model (python -m clipserve export onnx); default: made now')
    parser.add_argument('--seconds', type=float, default=4.0)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args()

    from clipserve import Model

    with tempfile.TemporaryDirectory() as scratch:
        export = args.export
        if not export:
            from clipserve.backends.onnx.export import export_onnx

            export = f'{scratch}/export'
            export_onnx(args.model, export)
        texts, images = [CAPTION] * FASTEMBED_BATCH, jpegs(IMAGES)
        onnx = Model(args.model, backend='onnx', model_path=str(export), batch_size=FASTEMBED_BATCH)
        torch = Model(args.model, backend='torch', batch_size=FASTEMBED_BATCH)

        def rate(model, kind):
            if kind == 'texts':
                return lambda: sustained_rate(lambda: model.embed_texts(texts), len(texts), args.seconds)
            return lambda: sustained_rate(lambda: model.embed_images(images), len(images), args.seconds)

        with FastEmbedProcess(str(export), CAPTION) as fastembed:
            text_ratios, text_rates = bracketed(
                lambda: fastembed.rate(args.seconds),
                {'clipserve onnx': rate(onnx, 'texts'), f'clipserve torch ({torch.precision})': rate(torch, 'texts')},
                args.rounds,
            )
            check = fastembed.check
        image_ratios, image_rates = bracketed(
            rate(onnx, 'images'), {f'clipserve torch ({torch.precision})': rate(torch, 'images')}, args.rounds
        )
        onnx.close()
        torch.close()

    rows = [['FastEmbed (onnx)', f'{text_rates["baseline"]:.1f}', '1.00x', '-', '-']]
    rows.append(['clipserve onnx', f'{text_rates["clipserve onnx"]:.1f}', f'{text_ratios["clipserve onnx"]:.2f}x'])
    rows[-1] += [f'{image_rates["baseline"]:.1f}', '1.00x']
    torch_name = f'clipserve torch ({torch.precision})'
    rows.append([torch_name, f'{text_rates[torch_name]:.1f}', f'{text_ratios[torch_name]:.2f}x'])
    rows[-1] += [f'{image_rates[torch_name]:.1f}', f'{image_ratios[torch_name]:.2f}x']
    headers = ['in process', 'texts/s', 'texts vs FastEmbed', 'images/s', 'images vs clipserve onnx']
    print(markdown_table(headers, rows))
    print(f'FastEmbed against clipserve on the export: {check}')
    results = {
        'model': args.model,
        'machine': machine(),
        'seconds': args.seconds,
        'rounds': args.rounds,
        'texts_per_call': len(texts),
        'images_per_call': len(images),
        'fastembed_check': check,
        'texts': {'rates': text_rates, 'vs_fastembed': text_ratios},
        'images': {'rates': image_rates, 'vs_onnx': image_ratios},
    }
    path = save('in_process', results)
    plots.in_process(results, path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
