"""The pieces of benchmarks/serving.py: its workloads, FLOP counts, the served-rate client (asyncio clients in
this process), a checkpoint of the in-process model, free ports and peak memory."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np

from benchmarks.common import items_per_second

WORKLOADS = {'short': 'short texts', 'long': 'long captions', 'images': 'images 640x480'}  # --workloads
SHORT = 'a photo of a small brown dog running on the beach'  # ~10 words
LONG = (
    'a long detailed caption describing a crowded city street at night with neon signs, wet pavement '
    'reflecting the lights, people with umbrellas walking past shops, cars waiting at a red light, '
    'and a cyclist in a yellow jacket'
)


def gemm_peak(seconds: float = 2.0) -> float:
    """fp32 matrix-multiply FLOP/s with the threads torch uses (the machine's practical peak)."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    return items_per_second(lambda: a @ b, 2 * 2048**3, min_seconds=seconds)


def vit_flops(width: int, layers: int, tokens: int, patch_flops: float = 0.0, proj: float = 0.0) -> float:
    """2·L·N·12·d² (projections and MLP) + 4·L·N²·d (attention) + extras: a transformer's forward FLOPs."""
    return 2 * layers * tokens * 12 * width**2 + 4 * layers * tokens**2 * width + patch_flops + proj


def model_flops(cfg: dict, text_tokens: int) -> tuple[float, float]:
    v, t, dim = cfg['vision_cfg'], cfg['text_cfg'], cfg['embed_dim']
    grid = (v['image_size'] // v['patch_size']) ** 2
    image = vit_flops(
        v['width'], v['layers'], grid + 1, 2 * grid * 3 * v['patch_size'] ** 2 * v['width'], 2 * v['width'] * dim
    )
    text = vit_flops(t['width'], t['layers'], text_tokens, 0, 2 * t['width'] * dim)
    return image, text


def save_checkpoint(model, arch: str, folder: str) -> str:
    """Write `model`'s weights as a safetensors checkpoint; returns the model name that loads it."""
    from safetensors.torch import save_file

    path = Path(folder) / 'weights.safetensors'
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return f'{arch}::{path}'


def jpeg_640x480() -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:480, 0:640]
    pixels = np.clip(np.stack([x / 2.5, y / 1.9, (x + y) / 4.4], -1) + rng.normal(0, 12, (480, 640, 3)), 0, 255)
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, format='JPEG', quality=90)
    return buf.getvalue()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def rss_peak_mb(pid: int) -> float:
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('VmHWM')) / 1024


def served(port: int, docs_fn, clients: int, per_request: int, seconds: float) -> float:
    """Documents/s through the Flow with `clients` concurrent asyncio clients, `per_request` docs per request.

    asyncio clients in one thread keep the client side cheap: on a 2-core machine, client threads
    would otherwise take the cores the server is being measured on. Every client finishes one
    warm-up request before the clock starts (connections open, model warm); the clock stops when
    the last request sent before the deadline has come back, and all of those are counted.
    """
    import asyncio

    from jina import Client

    async def post(client):
        async for _ in client.post('/', docs_fn(per_request)):
            pass

    async def keep_posting(client, counts, i, stop):
        while time.perf_counter() < stop:
            await post(client)
            counts[i] += per_request

    async def run():
        pool = [Client(host='127.0.0.1', port=port, asyncio=True) for _ in range(clients)]
        await asyncio.gather(*(post(client) for client in pool))
        counts = [0] * clients
        started = time.perf_counter()
        await asyncio.gather(*(keep_posting(client, counts, i, started + seconds) for i, client in enumerate(pool)))
        return sum(counts) / (time.perf_counter() - started)

    return asyncio.run(run())


def cpu_capabilities() -> str:
    """The CPU's bf16 and int8 (VNNI) instructions, as the flags name them."""
    from clipserve.backends.precision import cpu_bf16

    try:
        with open('/proc/cpuinfo') as f:
            flags = set(next(line for line in f if line.startswith('flags')).split(':', 1)[1].split())
    except (OSError, StopIteration):
        flags = set()
    vnni = sorted(flags & {'avx512_vnni', 'avx_vnni', 'amx_int8'}) or ['none']
    return f'bf16: {cpu_bf16()[1]}; int8 dot products: {", ".join(vnni)}'


def fp32_torch_model(model: str):
    from clipserve.backends import BackendOptions, create_backend

    return create_backend('torch', model, BackendOptions(device='cpu', dtype='fp32')).model
