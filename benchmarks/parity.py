"""Parity of clipserve's preprocessing and torch backend with open_clip's own, printed as a table.

    .venv/bin/python -m benchmarks.parity [--model ViT-B-32::random] [--out benchmarks/results/parity.json]

For each test image kind: max |clipserve preprocess - open_clip preprocess|, and max |embedding
difference| for images and texts on the same model and weights.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import open_clip
import torch
from PIL import Image

from clipserve.backends import BackendOptions, create_backend
from clipserve.models.preprocess import preprocess_bytes
from clipserve.models.tokenizer import Tokenizer


def test_images() -> dict[str, bytes]:
    rng = np.random.default_rng(0)

    def encode(image, fmt, **kw):
        buf = io.BytesIO()
        image.save(buf, format=fmt, **kw)
        return buf.getvalue()

    def noise(w, h, c=3):
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x * y) % 256, x % 256][:c], -1)
        return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)

    return {
        'JPEG 640x480': encode(Image.fromarray(noise(640, 480)), 'JPEG', quality=90),
        'PNG RGBA 300x200': encode(Image.fromarray(noise(300, 200, 4), 'RGBA'), 'PNG'),
        'grayscale 500x375': encode(Image.fromarray(noise(500, 375)[..., 0], 'L'), 'PNG'),
        'CMYK JPEG 320x240': encode(Image.fromarray(noise(320, 240, 4), 'CMYK'), 'JPEG'),
        'tiny 1x1': encode(Image.fromarray(noise(1, 1)), 'PNG'),
        'very wide 1600x20': encode(Image.fromarray(noise(1600, 20)), 'PNG'),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--out', default='benchmarks/results/parity.json')
    args = parser.parse_args()

    backend = create_backend('torch', args.model, BackendOptions(device='cpu'))
    cfg = backend.preprocess
    reference = open_clip.image_transform(cfg.image_size, is_train=False, mean=cfg.mean, std=cfg.std)
    rows = []
    with torch.inference_mode():
        for kind, data in test_images().items():
            ours = preprocess_bytes(data, cfg)
            theirs = reference(Image.open(io.BytesIO(data))).numpy()
            e_ours = backend.encode_images(ours[None])
            e_theirs = backend.model.encode_image(torch.from_numpy(theirs)[None]).numpy()
            rows.append(
                {
                    'input': kind,
                    'preprocess_max_abs': float(np.abs(ours - theirs).max()),
                    'embedding_max_abs': float(np.abs(e_ours - e_theirs).max()),
                }
            )
        texts = ['a photo of a dog', 'Ünïcode, emoji 🐶 and &amp; entities', 'word ' * 100, '']
        ours = backend.encode_texts(Tokenizer(backend.context_length)(texts).input_ids)
        theirs = backend.model.encode_text(open_clip.tokenize(texts, backend.context_length)).numpy()
        rows.append(
            {
                'input': f'{len(texts)} texts',
                'preprocess_max_abs': 0.0
                if np.array_equal(Tokenizer(backend.context_length)(texts).input_ids, open_clip.tokenize(texts).numpy())
                else float('nan'),
                'embedding_max_abs': float(np.abs(ours - theirs).max()),
            }
        )

    print(f'\nparity with open_clip {open_clip.__version__}, model {backend.model_name}, torch {torch.__version__}\n')
    print('| input | preprocess max abs diff | embedding max abs diff |\n|---|---|---|')
    for r in rows:
        print(f'| {r["input"]} | {r["preprocess_max_abs"]:.2e} | {r["embedding_max_abs"]:.2e} |')
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({'model': backend.model_name, 'when': time.strftime('%Y-%m-%d'), 'rows': rows}, indent=2))
    print(f'\nwrote {out}')


if __name__ == '__main__':
    main()
