"""What `jpeg_draft: true` buys and costs: decode+preprocess time, pixel and embedding differences.

    .venv/bin/python -m benchmarks.jpeg_draft [--model ViT-B-32::random]

For photo-like JPEGs of several sizes: milliseconds per image for the exact path (bit-identical to
open_clip's preprocessing) and for libjpeg's draft mode (decode at 1/2, 1/4 or 1/8 scale), the
largest and mean difference of the normalised pixels, and the cosine similarity of the two
embeddings. Prints a table, writes benchmarks/results/jpeg_draft.json and .png.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import time

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from benchmarks.common import machine, markdown_table, save, save_plot

SIZES = [(640, 480), (1280, 960), (1920, 1080), (4032, 3024)]


def photo_like_jpeg(width: int, height: int, seed: int = 0) -> bytes:
    """Smooth gradients, shapes with edges, fine texture and sensor noise, saved at quality 90."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width * 200 + 30, y / height * 180 + 40, (x + y) / (width + height) * 150 + 60], -1)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        r = int(rng.integers(width // 40, width // 6))
        draw.ellipse([x0 - r, y0 - r, x0 + r, y0 + r], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    image = image.filter(ImageFilter.GaussianBlur(1.2))
    pixels = np.asarray(image, dtype=np.float32)
    texture = 12 * np.sin(x / 3.1)[..., None] * np.cos(y / 2.7)[..., None]
    pixels = np.clip(pixels + texture + rng.normal(0, 6, pixels.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format='JPEG', quality=90)
    return buf.getvalue()


def ms_per_image(fn, min_seconds: float = 1.5) -> float:
    fn()
    times, started = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    args = parser.parse_args()

    from clipserve.backends import BackendOptions, create_backend
    from clipserve.models.preprocess import preprocess_bytes

    backend = create_backend('torch', args.model, BackendOptions(device='cpu'))
    exact = backend.preprocess
    draft = dataclasses.replace(exact, jpeg_draft=True)
    rows = []
    for width, height in SIZES:
        data = photo_like_jpeg(width, height)
        a, b = preprocess_bytes(data, exact), preprocess_bytes(data, draft)
        embeddings = backend.encode_images(np.stack([a, b]))
        unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
        t_exact = ms_per_image(lambda: preprocess_bytes(data, exact))
        t_draft = ms_per_image(lambda: preprocess_bytes(data, draft))
        rows.append(
            {
                'size': f'{width}x{height}',
                'kb': len(data) / 1024,
                'exact_ms': t_exact,
                'draft_ms': t_draft,
                'speedup': t_exact / t_draft,
                'pixel_max_abs': float(np.abs(a - b).max()),
                'pixel_mean_abs': float(np.abs(a - b).mean()),
                'embedding_cosine': float(unit[0] @ unit[1]),
            }
        )
    info = machine()
    print(
        f'\n{args.model}, {info["cpu"]}, load {info["load_avg"]:.2f}, {info["when"]}; normalised pixels '
        f'span about 4 units (x / 255 - mean) / std\n'
    )
    print(
        markdown_table(
            [
                'JPEG',
                'KB',
                'exact ms',
                'draft ms',
                'speed-up',
                'pixel max |diff|',
                'pixel mean |diff|',
                'embedding cosine',
            ],
            [
                [
                    r['size'],
                    f'{r["kb"]:.0f}',
                    f'{r["exact_ms"]:.1f}',
                    f'{r["draft_ms"]:.1f}',
                    f'{r["speedup"]:.1f}x',
                    f'{r["pixel_max_abs"]:.3f}',
                    f'{r["pixel_mean_abs"]:.4f}',
                    f'{r["embedding_cosine"]:.5f}',
                ]
                for r in rows
            ],
        )
    )
    path = save('jpeg_draft', {'model': args.model, 'machine': info, 'rows': rows})

    def draw(ax):
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r['exact_ms'] for r in rows], 0.4, label='exact (open_clip)')
        ax.bar(x + 0.2, [r['draft_ms'] for r in rows], 0.4, label='jpeg_draft')
        ax.set_xticks(x, [r['size'] for r in rows])
        ax.set_ylabel('ms per image (decode + preprocess)')
        ax.legend()

    save_plot(path, draw)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
