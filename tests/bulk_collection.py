"""Collections the bulk-embedding tests make themselves: generated images with captions, in each input format.

`make_folder` writes clip-retrieval's "files" layout: `img_NNN.jpg` + `img_NNN.txt`, plus one corrupt file
(`corrupt.jpg`, with a caption) whose row must end up in errors/. Image 39 is image 7 with a little noise,
so an index built from the output has a known nearest neighbour.
"""

from __future__ import annotations

import glob
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TINY = 'clipserve-tiny::random'
DUPLICATE_OF = {39: 7}


def image_bytes(seed: int, width: int = 96, height: int = 72, fmt: str = 'JPEG', noise: float = 25.0) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 3 + seed * 11, y * 3 + seed * 5, (x * y) // 7 + seed * 3], axis=-1) % 256
    pixels = np.clip(base + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, quality=92)
    return buffer.getvalue()


def _pixels_of(seed: int) -> bytes:
    source = DUPLICATE_OF.get(seed, seed)
    data = image_bytes(source)
    if seed in DUPLICATE_OF:  # the same picture, re-encoded with a little noise: a near duplicate
        image = np.asarray(Image.open(io.BytesIO(data))).astype(np.int16)
        image += np.random.default_rng(1000 + seed).integers(-3, 4, image.shape).astype(np.int16)
        buffer = io.BytesIO()
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, format='JPEG', quality=92)
        data = buffer.getvalue()
    return data


def caption(i: int) -> str:
    colours = ('red', 'green', 'blue', 'yellow', 'purple')
    return f'picture {i}: a {colours[i % 5]} gradient with some noise'


def make_folder(folder: Path, n: int = 40, corrupt: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f'img_{i:03d}.jpg').write_bytes(_pixels_of(i))
        (folder / f'img_{i:03d}.txt').write_text(caption(i))
    if corrupt:
        (folder / 'corrupt.jpg').write_bytes(b'\xff\xd8\xff\xe0 this is not really a JPEG' * 8)
        (folder / 'corrupt.txt').write_text('a file that does not decode')
    return folder


def make_tar(path: Path, first: int, n: int, without_image: int | None = None) -> Path:
    """A webdataset shard: KEY.jpg + KEY.txt per sample; sample `without_image` has only its caption."""
    with tarfile.open(path, 'w') as tar:
        for i in range(first, first + n):
            members = {'txt': caption(i).encode()}
            if i != without_image:
                members['jpg'] = _pixels_of(i)
            for ext, data in members.items():
                info = tarfile.TarInfo(f'{i:06d}.{ext}')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def run_embed(*args, env=None, check=True, timeout=300) -> subprocess.CompletedProcess:
    """`python -m clipserve embed ...` in a fresh interpreter, as a user runs it."""
    environment = {**os.environ, 'CLIPSERVE_CPU_BF16': '0', **(env or {})}
    result = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'embed', *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
        cwd=ROOT,
    )
    if check and result.returncode != 0:
        raise AssertionError(f'embed exited {result.returncode}:\n{result.stderr[-4000:]}')
    return result


def read_output(folder: Path) -> dict:
    """The output as autofaiss and clip-retrieval's back end read it: every shard, concatenated in name order."""
    import pandas as pd

    def cat(kind: str, ext: str):
        return sorted(glob.glob(str(folder / kind / f'{kind}_*.{ext}')))

    out = {
        'img': np.concatenate([np.load(f) for f in cat('img_emb', 'npy')]) if cat('img_emb', 'npy') else None,
        'text': np.concatenate([np.load(f) for f in cat('text_emb', 'npy')]) if cat('text_emb', 'npy') else None,
        'metadata': pd.concat([pd.read_parquet(f) for f in cat('metadata', 'parquet')], ignore_index=True),
        'errors': pd.concat([pd.read_parquet(f) for f in cat('errors', 'parquet')], ignore_index=True)
        if cat('errors', 'parquet')
        else pd.DataFrame(columns=['image_path', 'url', 'caption', 'position', 'width', 'height', 'error']),
    }
    return out


def files_of(folder: Path) -> dict[str, bytes]:
    """Every output file by relative path (the lock file and the job description aside)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob('*'))
        if p.is_file() and p.name not in ('.embed.lock',)
    }


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
