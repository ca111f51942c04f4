"""Accuracy and speed of each backend x precision on the CPU, against fp32 of the same model.

    .venv/bin/python -m benchmarks.precision [--model ViT-B-32::random] [--images 200] [--seconds 3]
    .venv/bin/python -m benchmarks.precision --ckpt ViT-B-32::/path/weights.safetensors --image-dir ./photos

For every configuration (torch fp32 / auto / bf16, onnx fp32 / int8, openvino fp32 / bf16 / int8 where
installed; torch auto is bf16 where the CPU computes bf16 natively, what a Flow serves by default):
the cosine of each text and image embedding to torch fp32's (min and mean), the top-10 agreement of a
text-to-image retrieval (for each caption, the share of fp32's ten best images that the configuration also
ranks in its ten best), how much an embedding depends on what shares its batch (16 texts and images
encoded alone vs in their batch: the minimum cosine), and model-only texts/s and images/s, each bracketed
by torch fp32 measured just before and after it. Without --ckpt the model has seeded random weights and
the images are generated (random shapes on random backgrounds): the figures say how much a precision
perturbs embeddings and rankings of this architecture, not how a trained model's accuracy changes; run it
with --ckpt on your own weights and images for that. Prints a table, writes
benchmarks/results/precision.json and precision.png.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from benchmarks import plots
from benchmarks.common import bracketed, machine, markdown_table, save, sustained_rate

WORDS = 'red green blue small large round square dog cat car tree house boat bird flower street night beach'.split()


def captions(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f'a photo of a {" ".join(rng.choice(WORDS, size=4))}' for _ in range(n)]


def generated_images(n: int, seed: int = 0) -> list[bytes]:
    """JPEGs of a few random shapes on a random background: varied, cheap, reproducible."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        image = Image.new('RGB', (320, 240), tuple(int(c) for c in rng.integers(0, 256, 3)))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 6))):
            x0, y0 = int(rng.integers(0, 280)), int(rng.integers(0, 200))
            box = (x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120)))
            fill = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
        buffer = io.BytesIO()
        image.save(buffer, format='JPEG', quality=90)
        out.append(buffer.getvalue())
    return out


def folder_images(folder: str, n: int) -> list[bytes]:
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in ('.jpg', '.jpeg', '.png', '.webp'))
    return [p.read_bytes() for p in paths[:n]]


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def top10_agreement(texts: np.ndarray, images: np.ndarray, ref_texts: np.ndarray, ref_images: np.ndarray) -> float:
    k = min(10, len(images))
    ours = np.argsort(-_normalised(texts) @ _normalised(images).T, axis=1)[:, :k]
    want = np.argsort(-_normalised(ref_texts) @ _normalised(ref_images).T, axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, want)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--ckpt', help='a model name with your weights (e.g. ViT-B-32::/path/w.safetensors)')
    parser.add_argument('--image-dir', help='your images (jpg/png/webp); default: generated ones')
    parser.add_argument('--images', type=int, default=200)
    parser.add_argument('--texts', type=int, default=100)
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--rounds', type=int, default=2)
    args = parser.parse_args()

    from clipserve.backends import BackendOptions, create_backend
    from clipserve.backends.cpu_features import cpu_features
    from clipserve.backends.onnx.export import export_onnx
    from clipserve.errors import BackendUnavailableError
    from clipserve.models.preprocess import preprocess_bytes

    name = args.ckpt or args.model
    features = cpu_features()
    native_bf16 = bool(features.native_bf16)
    print(f'CPU: {features.describe()}')
    workdir = tempfile.TemporaryDirectory(prefix='clipserve-precision-')
    exported = Path(workdir.name) / 'onnx'
    export_onnx(name, exported)
    # torch auto: what a Flow serves by default (bf16 where the CPU computes bf16 natively)
    configs = {'torch fp32': ('torch', 'fp32'), 'torch auto': ('torch', 'auto'), 'torch bf16': ('torch', 'bf16')}
    configs.update({'onnx fp32': ('onnx', 'fp32'), 'onnx int8': ('onnx', 'int8')})
    try:
        import openvino  # noqa: F401 - the openvino extra

        configs.update({f'openvino {d}': ('openvino', d) for d in ('fp32', 'bf16', 'int8')})
    except ImportError:
        print('openvino is not installed (pip install "clipserve[openvino]"): its rows are left out')
    if not native_bf16:
        print('this CPU has no native bf16 (avx512_bf16 / amx_bf16): torch bf16 is emulated, shown for completeness')
    backends, refused = {}, {}
    for label, (kind, dtype) in configs.items():
        try:
            backends[label] = create_backend(
                kind,
                name if kind == 'torch' else None,
                BackendOptions(device='cpu', dtype=dtype),
                model_path=None if kind == 'torch' else str(exported),
            )
        except BackendUnavailableError as e:  # a precision this CPU does not compute (natively, or correctly)
            refused[label] = str(e)
            print(f'{label}: refused on this CPU: {e}')
    reference = backends['torch fp32']
    texts = captions(args.texts)
    data = folder_images(args.image_dir, args.images) if args.image_dir else generated_images(args.images)
    pixels = np.stack([preprocess_bytes(d, reference.preprocess) for d in data])
    tokens = reference.tokenizer(texts)
    embedded = {
        label: (b.encode_texts(tokens.input_ids, tokens.attention_mask), b.encode_images(pixels))
        for label, b in backends.items()
    }
    ref_texts, ref_images = embedded['torch fp32']
    # the same input alone vs in its batch (texts: a batch of all captions, padded to the longest)
    alone = {
        label: (
            np.concatenate(
                [b.encode_texts(tokens.input_ids[i : i + 1], tokens.attention_mask[i : i + 1]) for i in range(16)]
            ),
            np.concatenate([b.encode_images(pixels[i : i + 1]) for i in range(16)]),
        )
        for label, b in backends.items()
    }

    def cosines(x, y):
        return (_normalised(x) * _normalised(y)).sum(axis=1)

    batch_tokens = reference.tokenizer(texts[:8])
    batch_pixels = pixels[:8]

    def speed(backend, what):
        if what == 'texts':
            return lambda: sustained_rate(
                lambda: backend.encode_texts(batch_tokens.input_ids, batch_tokens.attention_mask), 8, args.seconds
            )
        return lambda: sustained_rate(lambda: backend.encode_images(batch_pixels), 8, args.seconds)

    rows, results = [], []
    speeds = {}
    for what in ('texts', 'images'):
        others = {label: speed(b, what) for label, b in backends.items() if label != 'torch fp32'}
        speeds[what] = bracketed(speed(reference, what), others, args.rounds)
    for label in backends:
        t_cos, i_cos = cosines(embedded[label][0], ref_texts), cosines(embedded[label][1], ref_images)
        agreement = top10_agreement(*embedded[label], ref_texts, ref_images)
        batch_effect = min(
            cosines(alone[label][0], embedded[label][0][:16]).min(),
            cosines(alone[label][1], embedded[label][1][:16]).min(),
        )
        ratio = {what: 1.0 if label == 'torch fp32' else speeds[what][0][label] for what in speeds}
        rate = {what: speeds[what][1]['baseline' if label == 'torch fp32' else label] for what in speeds}
        result = {
            'config': label,
            'text_cosine_min': float(t_cos.min()),
            'text_cosine_mean': float(t_cos.mean()),
            'image_cosine_min': float(i_cos.min()),
            'image_cosine_mean': float(i_cos.mean()),
            'top10_agreement': agreement,
            'alone_vs_batched_cosine_min': float(batch_effect),
            'texts_per_s': rate['texts'],
            'images_per_s': rate['images'],
            'texts_vs_torch_fp32': ratio['texts'],
            'images_vs_torch_fp32': ratio['images'],
        }
        results.append(result)
        rows.append(
            [
                label,
                f'{t_cos.min():.5f} / {t_cos.mean():.5f}',
                f'{i_cos.min():.5f} / {i_cos.mean():.5f}',
                f'{agreement:.3f}',
                f'{batch_effect:.5f}',
                f'{rate["texts"]:.1f} ({ratio["texts"]:.2f}x)',
                f'{rate["images"]:.1f} ({ratio["images"]:.2f}x)',
            ]
        )
    for label, why in refused.items():
        results.append({'config': label, 'refused': why})
        rows.append([label, 'refused on this CPU: ' + why.split('. ')[0][:110], '', '', '', '', ''])
    headers = [
        'config',
        'text cosine min / mean',
        'image cosine min / mean',
        'top-10 agreement',
        'alone vs in a batch (min cosine)',
        'texts/s',
        'images/s',
    ]
    info = machine()
    print(f'\n{name}, {len(texts)} texts, {len(data)} images; {info["cpu"]}, {info["cores"]} cores')
    print(
        f'CPU: {features.describe()}; bf16 {"native" if native_bf16 else "emulated (no native bf16)"}; '
        f'int8 dot products: {", ".join(features.int8_dot) or "none (no VNNI/AMX)"}'
    )
    print(markdown_table(headers, rows))
    path = save(
        'precision',
        {'machine': info, 'cpu': features.describe(), 'model': name, 'native_bf16': native_bf16, 'results': results},
    )
    plots.precision(json.loads(path.read_text()), path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
