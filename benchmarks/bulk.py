"""Bulk embedding end to end: clipserve's local engine and Ray engine against clip-retrieval's clip_inference.

    .venv/bin/python -m benchmarks.bulk [--images 2000] [--no-ray] [--no-clip-inference]

The same input for all: webdataset tars of generated pictures (320x240 JPEG) with captions, images and
captions both embedded. The same model and weights: ViT-B-32 with seeded random weights saved once as a
local checkpoint file, which clipserve loads as `ViT-B-32::/path/ckpt.pt` and clip_inference as
`open_clip:ViT-B-32//path/ckpt.pt` (open_clip takes a path as `pretrained`); the cosines between the tools'
vectors are printed to show it. End to end is the wall-clock time of the whole command, start-up, model
load and warm-up included, until every row is written. clipserve runs at its default precision (dtype auto:
bf16 on a CPU with native bf16) and at fp32, clip_inference's precision on a CPU.
clip_inference runs from its own venv (`python3 -m venv .venv-clip-retrieval && .venv-clip-retrieval/bin/pip
install clip-retrieval==2.45.0 'setuptools<81'`: its `clip` package still imports pkg_resources), with
`--clip-inference-args` (default: batch 32 and 2 preprocessing workers, its defaults being 256 and 4, whose
warm-up alone runs 2 x 256 images). It reads tars, not a folder: its "files" reader with captions looks images
up by the caption file's name and fails on the first row (2.45.0). The Ray engine runs on a one-node cluster
(started from `.venv-ray`, a venv with Ray alone, see docs/bulk.md) inside a network and PID namespace, so
that Ray's traffic stays on loopback; it needs root and `unshare`.
Prints a table, writes benchmarks/results/bulk.json and bulk.png.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import plots
from benchmarks.common import machine, markdown_table, save

ROOT = Path(__file__).resolve().parents[1]
CLIP_RETRIEVAL = ROOT / '.venv-clip-retrieval' / 'bin' / 'clip-retrieval'
RAY_VENV = ROOT / '.venv-ray'
WORDS = ('red', 'green', 'blue', 'yellow', 'purple', 'striped', 'blurry', 'bright', 'dark', 'noisy')


def make_tars(folder: Path, images: int, per_tar: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:240, 0:320]
    for t in range(0, images, per_tar):
        with tarfile.open(folder / f'shard-{t // per_tar:04d}.tar', 'w') as tar:
            for i in range(t, min(t + per_tar, images)):
                a, b, c = rng.integers(1, 9, 3)
                base = np.stack([x * a + i, y * b + 3 * i, (x * c + y) // 2], axis=-1) % 256
                pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
                buffer = io.BytesIO()
                Image.fromarray(pixels).save(buffer, format='JPEG', quality=90)
                words = ' '.join(WORDS[k] for k in rng.integers(0, len(WORDS), 4))
                for ext, data in (('jpg', buffer.getvalue()), ('txt', f'picture {i}: a {words} pattern'.encode())):
                    info = tarfile.TarInfo(f'{i:06d}.{ext}')
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    last = (images - 1) // per_tar
    return str(folder / f'shard-{{0000..{last:04d}}}.tar')


def make_checkpoint(path: Path) -> None:
    import open_clip
    import torch

    torch.manual_seed(0)
    torch.save(open_clip.create_model('ViT-B-32').state_dict(), path)


def timed(
    command: list[str], env: dict | None = None, timeout: float = 3600
) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT, timeout=timeout
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f'{" ".join(command[:4])} ... exited {done.returncode}:\n{done.stderr[-3000:]}')
    return seconds, done


def embed_command(pattern: str, out: Path, checkpoint: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        '-m',
        'clipserve',
        'embed',
        pattern,
        '--output',
        str(out),
        '--model',
        f'ViT-B-32::{checkpoint}',
        '--quiet',
        '--json',
        *extra,
    ]


RAY_SCRIPT = r"""
set -u
ip link set lo up
export RAY_USAGE_STATS_ENABLED=0
{ray} start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus {cpus} --include-dashboard false \
    --temp-dir {temp} --disable-usage-stats >{temp}/head.log 2>&1 || {{ cat {temp}/head.log >&2; exit 100; }}
{command} >{temp}/summary.json
status=$?
for pid in $(ps -eo pid= | tr -d ' '); do [ "$pid" != "$$" ] && [ "$pid" != 1 ] && kill -KILL "$pid" 2>/dev/null; done
exit $status
"""


def ray_run(pattern: str, out: Path, checkpoint: Path, cores: int) -> tuple[float, dict]:
    """The Ray engine on a one-node cluster in a network and PID namespace; the wall time includes the cluster's start."""
    python = RAY_VENV / 'bin' / 'python'
    if not python.is_file():
        import ray

        subprocess.run([sys.executable, '-m', 'venv', str(RAY_VENV)], check=True)
        subprocess.run(
            [str(python), '-m', 'pip', 'install', '-q', '-c', str(ROOT / 'constraints.txt'), f'ray=={ray.__version__}'],
            check=True,
        )
    temp = Path(tempfile.mkdtemp(prefix='ray', dir='/tmp'))
    try:
        actor_cpus = max(1, cores - 1)
        command = embed_command(
            pattern,
            out,
            checkpoint,
            '--engine',
            'ray',
            '--address',
            '127.0.0.1:6379',
            '--actors',
            '1',
            '--actor-cpus',
            str(actor_cpus),
        )
        script = temp / 'run.sh'
        script.write_text(
            RAY_SCRIPT.format(
                ray=f'{python} -m ray.scripts.scripts',
                cpus=actor_cpus + 1,
                temp=temp,
                command=' '.join(f"'{c}'" for c in command),
            )
        )
        seconds, _ = timed(['unshare', '-n', '-p', '-f', '--mount-proc', 'bash', str(script)])
        return seconds, json.loads((temp / 'summary.json').read_text().strip().splitlines()[-1])
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def read_by_caption(folder: Path, caption_column: str = 'caption') -> tuple[dict, dict]:
    import pandas as pd

    img = np.concatenate([np.load(f) for f in sorted(glob.glob(str(folder / 'img_emb' / '*.npy')))])
    txt = np.concatenate([np.load(f) for f in sorted(glob.glob(str(folder / 'text_emb' / '*.npy')))])
    meta = pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(folder / 'metadata' / '*.parquet')))])
    captions = list(meta[caption_column])
    return dict(zip(captions, img.astype(np.float32))), dict(zip(captions, txt.astype(np.float32)))


def min_cosine(a: dict, b: dict) -> float:
    keys = sorted(set(a) & set(b))
    x, y = np.stack([a[k] for k in keys]), np.stack([b[k] for k in keys])
    return float(((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--images', type=int, default=2000)
    parser.add_argument('--per-tar', type=int, default=500)
    parser.add_argument('--no-ray', action='store_true')
    parser.add_argument('--no-clip-inference', action='store_true')
    parser.add_argument('--clip-inference-args', default='--batch_size 32 --num_prepro_workers 2')
    parser.add_argument(
        '--clip-inference-omp',
        type=int,
        help='also run clip_inference with OMP_NUM_THREADS set to this (its torch threads; it has no option for them)',
    )
    parser.add_argument('--workdir', help='keep inputs and outputs here (default: a temporary folder)')
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix='clipserve-bulk-'))
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = work / 'vit-b-32-random.pt'
    (work / 'input').mkdir(exist_ok=True)
    pattern = make_tars(work / 'input', args.images, args.per_tar)
    if not checkpoint.is_file():
        make_checkpoint(checkpoint)
    cores = len(os.sched_getaffinity(0))
    runs, outputs = [], {}

    def record(name: str, seconds: float, summary: dict | None, out: Path):
        rate = args.images / seconds
        runs.append(
            {
                'engine': name,
                'seconds': round(seconds, 1),
                'images_per_second': round(rate, 2),
                'in_run_images_per_second': summary and summary.get('images_per_second'),
            }
        )
        outputs[name] = out
        print(f'{name}: {seconds:.1f} s end to end, {rate:.1f} images/s', flush=True)

    for name, extra in (('clipserve local (auto)', []), ('clipserve local (fp32)', ['--dtype', 'fp32'])):
        out = work / name.replace(' ', '-').replace('(', '').replace(')', '')
        shutil.rmtree(out, ignore_errors=True)
        seconds, done = timed(embed_command(pattern, out, checkpoint, *extra))
        record(name, seconds, json.loads(done.stdout.strip().splitlines()[-1]), out)
    if not args.no_ray:
        out = work / 'clipserve-ray'
        shutil.rmtree(out, ignore_errors=True)
        try:
            seconds, summary = ray_run(pattern, out, checkpoint, cores)
            record('clipserve ray (auto)', seconds, summary, out)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
            print(f'(no Ray run: {e})')
    if not args.no_clip_inference:
        if not CLIP_RETRIEVAL.is_file():
            print(f"(no clip_inference run: {CLIP_RETRIEVAL} is missing; see this script's docstring)")
        else:
            variants = [('clip_inference', {})]
            if args.clip_inference_omp:
                variants.append(
                    (
                        f'clip_inference (OMP_NUM_THREADS={args.clip_inference_omp})',
                        {'OMP_NUM_THREADS': str(args.clip_inference_omp)},
                    )
                )
            for name, env in variants:
                out = work / name.replace(' ', '-').replace('(', '').replace(')', '').replace('=', '')
                shutil.rmtree(out, ignore_errors=True)
                command = [
                    str(CLIP_RETRIEVAL),
                    'inference',
                    pattern,
                    str(out),
                    '--input_format',
                    'webdataset',
                    '--clip_model',
                    f'open_clip:ViT-B-32/{checkpoint}',
                    '--enable_text',
                    'True',
                    *args.clip_inference_args.split(),
                ]
                seconds, _ = timed(command, env)
                record(name, seconds, None, out)

    reference = outputs.get('clip_inference')
    rows = []
    for run in runs:
        cos = '-'
        if reference is not None and not run['engine'].startswith('clip_inference'):
            a, b = read_by_caption(outputs[run['engine']]), read_by_caption(reference)
            run['min_cosine_to_clip_inference'] = {'images': min_cosine(a[0], b[0]), 'texts': min_cosine(a[1], b[1])}
            cos = f'{run["min_cosine_to_clip_inference"]["images"]:.5f} / {run["min_cosine_to_clip_inference"]["texts"]:.5f}'
        base = max((r['images_per_second'] for r in runs if r['engine'].startswith('clip_inference')), default=None)
        ratio = f'{run["images_per_second"] / base:.2f}x' if base else '-'
        run['vs_clip_inference'] = ratio
        rows.append(
            [
                run['engine'],
                run['seconds'],
                run['images_per_second'],
                run['in_run_images_per_second'] or '-',
                ratio,
                cos,
            ]
        )
    info = machine()
    print(
        f'\n{args.images} images + captions, ViT-B-32 (a random-weights checkpoint), {info["cpu"]}, '
        f'{info["cores"]} cores, load {info["load_avg"]:.1f}, {info["when"]}\n'
    )
    print(
        markdown_table(
            [
                'engine',
                'seconds',
                'images/s end to end',
                'images/s in the run',
                'vs clip_inference (its best row)',
                'min cosine to clip_inference (images / texts)',
            ],
            rows,
        )
    )
    path = save(
        'bulk',
        {
            'images': args.images,
            'model': 'ViT-B-32 (seeded random weights, local checkpoint)',
            'machine': info,
            'runs': runs,
        },
    )

    plots.bulk(json.loads(path.read_text()), path)
    print(f'\nwrote {path}')
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
