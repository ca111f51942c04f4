"""FastEmbed in-process on clipserve's ONNX export of a CLIP image tower: its images/s, like for like.

    .venv/bin/python -m benchmarks.fastembed_images EXPORT_DIR IMAGE_DIR [--batch 16] [--seconds 4] [--serve]

FastEmbed's ImageEmbedding has no custom image models, but loads one it knows from a local folder
(`specific_model_path`): the folder made here holds the export's visual graph as `model.onnx` (its weights
file linked beside it) and a `preprocessor_config.json` written from the export's clipserve.json
(CLIPImageProcessor: the shortest edge resized bicubic to the image size, a centre crop, the export's mean
and std), under the name of FastEmbed's own CLIP ViT-B/32 vision model (512-d, the projected embedding,
which FastEmbed L2-normalises). Each tool reads and decodes the same JPEG files (IMAGE_DIR) itself.

Before timing, the script checks FastEmbed's embeddings against clipserve's onnx backend on those images (min
cosine printed; the two resize implementations differ by a pixel's rounding, so it is near 1, not 1; below
0.99 it stops), then times `ImageEmbedding.embed(paths, batch_size=--batch)` over all of them, as a
sustained rate. `--batch` defaults to FastEmbed's own default. `--serve` answers as fastembed_text.py does:
one JSON line with the check, then, per line of seconds read from stdin, {"images_per_s": ...}; it ends at EOF.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.common import sustained_rate

MODEL_NAME = 'Qdrant/clip-ViT-B-32-vision'  # FastEmbed's CLIP ViT-B/32 image model: 512-d, model.onnx
MODEL_DIM = 512
BICUBIC = 3  # PIL's Image.Resampling.BICUBIC, as Hugging Face's image processors name it


def model_folder(export_dir: str | Path, folder: str | Path) -> Path:
    """`folder` with the export's visual graph as model.onnx (and its external data) and a CLIP preprocessor."""
    export_dir, folder = Path(export_dir).resolve(), Path(folder)
    meta = json.loads((export_dir / 'clipserve.json').read_text())
    if int(meta['embed_dim']) != MODEL_DIM or meta.get('resize_mode', 'shortest') != 'shortest':
        raise SystemExit(f'FastEmbed reads this folder as {MODEL_NAME} ({MODEL_DIM}-d, resized by the shortest edge)')
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'model.onnx').symlink_to(export_dir / 'visual.onnx')
    for data in export_dir.glob('visual.onnx.*'):  # the graph names its weights file, resolved beside it
        (folder / data.name).symlink_to(data)
    size = int(meta['image_size'])
    config = {
        'image_processor_type': 'CLIPImageProcessor',
        'do_convert_rgb': True,
        'do_resize': True,
        'size': {'shortest_edge': size},
        'resample': BICUBIC,
        'do_center_crop': True,
        'crop_size': {'height': size, 'width': size},
        'do_rescale': True,
        'rescale_factor': 1 / 255,
        'do_normalize': True,
        'image_mean': meta['mean'],
        'image_std': meta['std'],
    }
    (folder / 'preprocessor_config.json').write_text(json.dumps(config, indent=2))
    return folder


def load_fastembed(folder: Path, threads: int | None = None):
    from fastembed import ImageEmbedding

    return ImageEmbedding(
        MODEL_NAME, specific_model_path=str(folder), cache_dir=str(folder), threads=threads, local_files_only=True
    )


def check_against_clipserve(model, export_dir: str, paths: list[str]) -> dict:
    """Cosines of FastEmbed's embeddings to clipserve's onnx backend's (fp32, CPU, its own decoding) on `paths`."""
    import numpy as np

    from clipserve import Model

    with Model(None, backend='onnx', model_path=export_dir, dtype='fp32') as ours:
        theirs = np.stack(list(model.embed(paths, batch_size=len(paths)))).astype(np.float64)
        mine = ours.embed_images(paths).astype(np.float64)
    cosine = (mine * theirs).sum(1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(theirs, axis=1)
    return {'min_cosine': float(cosine.min()), 'images': len(paths)}


def images_per_second(model, paths: list[str], batch: int, seconds: float) -> float:
    """Sustained images/s of `embed` over every path per call (one warm-up call first)."""

    def call():
        for _ in model.embed(paths, batch_size=batch):
            pass

    return sustained_rate(call, len(paths), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('export_dir', help="a clipserve ONNX export's folder")
    parser.add_argument('image_dir', help='JPEG files, all timed per call')
    parser.add_argument('--batch', type=int, default=16, help="embed's batch_size (FastEmbed's default: 16)")
    parser.add_argument('--seconds', type=float, default=4.0)
    parser.add_argument('--threads', type=int, default=None, help="onnxruntime's threads (default: FastEmbed's)")
    parser.add_argument('--serve', action='store_true', help='answer a rate per line of seconds read from stdin')
    args = parser.parse_args()

    paths = sorted(str(p) for p in Path(args.image_dir).glob('*.jpg'))
    with tempfile.TemporaryDirectory(prefix='clipserve-fastembed-images-') as tmp:
        model = load_fastembed(model_folder(args.export_dir, Path(tmp) / 'model'), args.threads)
        check = check_against_clipserve(model, args.export_dir, paths[:8])
        print(json.dumps(check), flush=True)
        if check['min_cosine'] < 0.99:
            sys.exit(f'FastEmbed does not compute what clipserve does on this export: {check}')
        if not args.serve:
            rate = images_per_second(model, paths, args.batch, args.seconds)
            print(json.dumps({'images_per_s': rate}))
            return
        for line in sys.stdin:
            rate = images_per_second(model, paths, args.batch, float(line))
            print(json.dumps({'images_per_s': rate}), flush=True)


if __name__ == '__main__':
    main()
