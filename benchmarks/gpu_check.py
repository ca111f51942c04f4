"""GPU readiness check: parity (GPU vs CPU) and model-only throughput for torch, onnx and tensorrt.

    benchmarks/gpu_check.sh [--model ViT-B-32::random] [--batches 1 32 256] [--seconds 1.5] [--budget 450]

Meant for a lent GPU machine with no internet: it installs and downloads nothing. Every piece that
cannot run here (no torch, no CUDA, no onnxruntime CUDA provider, no TensorRT) prints `SKIP: why` and
the script still exits 0; a parity check over its limit prints `FAIL` and the exit status is 1.

- Parity: max cosine distance (1 - cos) between GPU and CPU fp32 embeddings of the same inputs,
  per backend and dtype; fp16/bf16 must stay within 1e-2, fp32 within 1e-3 (cuDNN may use TF32).
- Throughput: items/s of the backends' own encode calls (host numpy in, host float32 out, as the
  executor calls them) at each batch size, and the fraction of the GPU's peak that is: items/s x
  FLOPs per item / peak. FLOPs per item for ViT-B-32 are open_clip's profile (image 8.82 GFLOP;
  text 5.96 GFLOP at 77 tokens, scaled here by the tokens actually run after padding is trimmed).
  The peak is $CLIPSERVE_GPU_PEAK_FLOPS, default 989e12: the H200's dense BF16 tensor-core peak
  (NVIDIA's 1,979 TFLOPS is with 2:4 sparsity). Set it for other GPUs.
- TensorRT (wherever `import tensorrt` works): engines for clipserve-tiny (fp16 and fp32 parity,
  engine cache reuse, rebuild of a corrupt engine, the parser error for a broken graph), then
  ViT-B-32 fp16 parity and throughput with an engine built for the largest batch.

Results go to $OUT/gpu_check.json when $OUT is set, else benchmarks/results/gpu_check.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from common import items_per_second, machine, markdown_table

IMAGE_FLOPS = {'ViT-B-32': 8.82e9}  # open_clip docs/model_profile.csv, per item
TEXT_FLOPS_77 = {'ViT-B-32': 5.96e9}  # at 77 tokens; scaled by the real token count
DEFAULT_PEAK = 989e12
TINY = 'clipserve-tiny::random'
CAPTIONS = [
    'a photo of a small brown dog running on the beach at sunset',
    'two people riding bicycles along a busy city street in the rain',
    'a bowl of fresh fruit on a wooden kitchen table near a window',
    'an old red tractor parked in a green field under a cloudy sky',
]
LIMITS = {'fp16': 1e-2, 'bf16': 1e-2, 'fp32': 1e-3}


class Check:
    """Collects results, SKIP/FAIL lines and the time left, so each section can decide whether to run."""

    def __init__(self, budget: float):
        self.deadline = time.monotonic() + budget
        self.parity, self.throughput, self.notes, self.failures = [], [], [], []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def skip(self, what: str, why: str) -> None:
        line = f'SKIP: {what}: {why}'
        print(line, flush=True)
        self.notes.append(line)

    def enough_time(self, what: str, seconds: float) -> bool:
        if self.left() < seconds:
            self.skip(what, f'only {self.left():.0f}s of the time budget left (needs ~{seconds:.0f}s)')
            return False
        return True

    def compare(self, backend: str, dtype: str, kind: str, got: np.ndarray, want: np.ndarray, limit=None) -> None:
        limit = LIMITS[dtype] if limit is None else limit
        distance = cosine_distance(got, want)
        ok = bool(distance <= limit)
        self.parity.append(
            {
                'backend': backend,
                'dtype': dtype,
                'input': kind,
                'max_cosine_distance': distance,
                'limit': limit,
                'ok': ok,
            }
        )
        print(
            f'{"ok  " if ok else "FAIL"} parity {backend} {dtype} {kind}: max cosine distance {distance:.2e} '
            f'(limit {limit:g})',
            flush=True,
        )
        if not ok:
            self.failures.append(f'{backend} {dtype} {kind} parity {distance:.2e} > {limit:g}')

    def fail(self, what: str, error: BaseException) -> None:
        print(f'FAIL {what}: {type(error).__name__}: {error}', flush=True)
        traceback.print_exc()
        self.failures.append(f'{what}: {type(error).__name__}: {error}')


def cosine_distance(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((1.0 - (a * b).sum(axis=1)).max())


def inputs(size: int, n: int, rng=None):
    """n random normalised images and n captions (tokenised, with the mask the executor sends)."""
    from clipserve.models.tokenizer import Tokenizer

    rng = rng or np.random.default_rng(0)
    pixels = rng.normal(size=(n, 3, size, size)).astype(np.float32)
    tokens = Tokenizer()([CAPTIONS[i % len(CAPTIONS)] for i in range(n)])
    return pixels, tokens.input_ids, tokens.attention_mask


def embeddings(backend, pixels, ids, mask):
    return backend.encode_images(pixels), backend.encode_texts(ids, mask)


def measure(check: Check, label: str, dtype: str, backend, model: str, batches, seconds: float, peak: float) -> None:
    """items/s at each batch for images and texts, and the fraction of `peak` that is."""
    arch = model.split('::')[0]
    for batch in batches:
        if not check.enough_time(f'{label} {dtype} batch {batch} throughput', 3 * seconds + 5):
            return
        pixels, ids, mask = inputs(backend.image_size, batch)
        tokens_run = int(mask.sum(axis=1).max()) if backend.trims_padding else ids.shape[1]
        for kind, fn, flops in (
            ('images', lambda: backend.encode_images(pixels), IMAGE_FLOPS.get(arch)),
            (
                'texts',
                lambda: backend.encode_texts(ids, mask),
                TEXT_FLOPS_77.get(arch) and TEXT_FLOPS_77[arch] * tokens_run / 77,
            ),
        ):
            rate = items_per_second(fn, batch, min_seconds=seconds, warmup=2)
            row = {
                'backend': label,
                'dtype': dtype,
                'input': kind,
                'batch': batch,
                'items_per_s': rate,
                'tokens_run': tokens_run if kind == 'texts' else None,
            }
            if flops:
                row['tflops'] = rate * flops / 1e12
                row['fraction_of_peak'] = rate * flops / peak
            check.throughput.append(row)
            share = f', {row["tflops"]:.1f} TFLOP/s = {100 * row["fraction_of_peak"]:.2f}% of peak' if flops else ''
            print(f'     {label} {dtype} {kind} batch {batch}: {rate:,.1f} items/s{share}', flush=True)


# ---- sections ---------------------------------------------------------------------------------


def torch_section(check: Check, args, peak: float, reference) -> None:
    import torch

    from clipserve.backends import BackendOptions, create_backend

    if not torch.cuda.is_available():
        check.skip('torch on CUDA', f'torch {torch.__version__} sees no CUDA device')
        return
    pixels, ids, mask = reference['inputs']
    for dtype in ('fp32', 'fp16', 'bf16'):
        if not check.enough_time(f'torch {dtype}', 30):
            return
        try:
            backend = create_backend('torch', args.model, BackendOptions(device='cuda', dtype=dtype))
            images, texts = embeddings(backend, pixels, ids, mask)
            check.compare('torch', dtype, 'images', images, reference['images'])
            check.compare('torch', dtype, 'texts', texts, reference['texts'])
            if dtype in args.measure_dtypes:
                measure(check, 'torch', dtype, backend, args.model, args.batches, args.seconds, peak)
            del backend
            torch.cuda.empty_cache()
        except Exception as e:
            check.fail(f'torch {dtype}', e)


def export_for(check: Check, model: str) -> Path | None:
    """clipserve's ONNX export of `model`, from the cache or made now (on the CPU, needs torch)."""
    from clipserve.backends.export_format import export_cache_dir
    from clipserve.backends.onnx_export import export_to_cache

    target = export_cache_dir(model)
    if not (target / 'clipserve.json').is_file():
        if not check.enough_time(f'ONNX export of {model}', 120):
            return None
        started = time.monotonic()
        export_to_cache(model, target)
        print(f'     exported {model} to ONNX in {time.monotonic() - started:.0f}s: {target}', flush=True)
    return target


def onnx_section(check: Check, args, peak: float, reference, folder: Path | None) -> None:
    try:
        import onnxruntime as ort
    except ImportError as e:
        check.skip('onnx on CUDA', f'onnxruntime is not installed ({e})')
        return
    if 'CUDAExecutionProvider' not in ort.get_available_providers():
        check.skip(
            'onnx on CUDA',
            f'onnxruntime {ort.__version__} has no CUDA provider '
            f'({", ".join(ort.get_available_providers())}); it needs onnxruntime-gpu',
        )
        return
    if folder is None:
        check.skip('onnx on CUDA', 'no ONNX export')
        return
    from clipserve.backends import BackendOptions, create_backend

    pixels, ids, mask = reference['inputs']
    for dtype in ('fp32', 'fp16'):
        if not check.enough_time(f'onnx {dtype}', 60):
            return
        try:
            backend = create_backend(
                'onnx', args.model, BackendOptions(device='cuda', dtype=dtype), model_path=str(folder)
            )
            images, texts = embeddings(backend, pixels, ids, mask)
            check.compare('onnx', dtype, 'images', images, reference['images'])
            check.compare('onnx', dtype, 'texts', texts, reference['texts'])
            if dtype == 'fp16':
                measure(check, 'onnx', dtype, backend, args.model, args.batches, args.seconds, peak)
        except Exception as e:
            check.fail(f'onnx {dtype}', e)


def tensorrt_section(check: Check, args, peak: float, reference, folder: Path | None) -> None:
    try:
        import tensorrt
    except Exception as e:
        check.skip(
            'tensorrt',
            f'`import tensorrt` failed ({e}); install it with pip install "clipserve[tensorrt]" '
            '(needs pypi.nvidia.com)',
        )
        return
    print(f'     TensorRT {tensorrt.__version__}', flush=True)
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.errors import EngineBuildError

    # Cache behaviour and fp32/fp16 parity on the tiny model (engines build in seconds), in a fresh cache.
    saved_cache = os.environ.get('CLIPSERVE_CACHE')
    fresh = tempfile.mkdtemp(prefix='clipserve-trt-check-')
    try:
        if check.enough_time('tensorrt tiny-model checks', 90):
            os.environ['CLIPSERVE_CACHE'] = fresh
            tiny = export_for(check, TINY)
            cpu = create_backend('torch', TINY, BackendOptions(device='cpu'))
            pixels, ids, mask = inputs(cpu.image_size, 10)
            want = embeddings(cpu, pixels, ids, mask)
            for dtype in ('fp32', 'fp16'):
                backend = create_backend(
                    'tensorrt', TINY, BackendOptions(dtype=dtype), model_path=str(tiny), max_batch=8
                )
                got = embeddings(backend, pixels, ids, mask)
                check.compare('tensorrt-tiny', dtype, 'images', got[0], want[0], 1e-4 if dtype == 'fp32' else None)
                check.compare('tensorrt-tiny', dtype, 'texts', got[1], want[1], 1e-4 if dtype == 'fp32' else None)
                print(f'     built: {backend.built}; trims padding: {backend.trims_padding}', flush=True)
            again = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny), max_batch=8)
            reused = again.built == {'visual': None, 'textual': None}
            print(f'{"ok  " if reused else "FAIL"} tensorrt engine cache reused: {again.built}', flush=True)
            again.engine_files['textual'].write_bytes(b'\0' * 64)
            rebuilt = create_backend('tensorrt', TINY, BackendOptions(), model_path=str(tiny), max_batch=8)
            redone = bool(rebuilt.built['textual']) and rebuilt.built['visual'] is None
            print(f'{"ok  " if redone else "FAIL"} tensorrt corrupt engine rebuilt: {rebuilt.built}', flush=True)
            if not (reused and redone):
                check.failures.append(f'tensorrt engine cache: reuse {again.built}, rebuild {rebuilt.built}')
            broken = Path(fresh) / 'broken'
            shutil.copytree(tiny, broken)
            (broken / 'visual.onnx').write_bytes(b'this is not an ONNX graph')
            try:
                create_backend('tensorrt', TINY, BackendOptions(), model_path=str(broken))
                check.failures.append('tensorrt accepted a broken ONNX file')
            except EngineBuildError as e:
                print(f'ok   tensorrt build error is reported:\n{e}', flush=True)
    except Exception as e:
        check.fail('tensorrt tiny-model checks', e)
    finally:
        if saved_cache is None:
            os.environ.pop('CLIPSERVE_CACHE', None)
        else:
            os.environ['CLIPSERVE_CACHE'] = saved_cache
        shutil.rmtree(fresh, ignore_errors=True)

    if folder is None or not check.enough_time(f'tensorrt {args.model} fp16 (engine build)', 200):
        return
    try:
        started = time.monotonic()
        backend = create_backend(
            'tensorrt', args.model, BackendOptions(dtype='fp16'), model_path=str(folder), max_batch=max(args.batches)
        )
        print(
            f'     tensorrt {args.model}: ready in {time.monotonic() - started:.0f}s, built: {backend.built}',
            flush=True,
        )
        images, texts = embeddings(backend, *reference['inputs'])
        check.compare('tensorrt', 'fp16', 'images', images, reference['images'])
        check.compare('tensorrt', 'fp16', 'texts', texts, reference['texts'])
        measure(check, 'tensorrt', 'fp16', backend, args.model, args.batches, args.seconds, peak)
        backend.close()
    except Exception as e:
        check.fail(f'tensorrt {args.model} fp16', e)


# ---- main -------------------------------------------------------------------------------------


def environment() -> dict:
    info = {'machine': machine()}
    try:
        import torch

        info['torch'] = torch.__version__
        info['torch_cuda'] = torch.version.cuda
        if torch.cuda.is_available():
            info['gpu'] = torch.cuda.get_device_name(0)
            info['compute_capability'] = '.'.join(map(str, torch.cuda.get_device_capability(0)))
            info['gpu_count'] = torch.cuda.device_count()
    except ImportError as e:
        info['torch'] = f'not installed ({e})'
    try:
        import onnxruntime as ort

        info['onnxruntime'] = f'{ort.__version__} ({", ".join(ort.get_available_providers())})'
    except ImportError:
        info['onnxruntime'] = 'not installed'
    try:
        import tensorrt

        info['tensorrt'] = tensorrt.__version__
    except Exception as e:
        info['tensorrt'] = f'not importable ({type(e).__name__}: {e})'
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--batches', type=int, nargs='+', default=[1, 32, 256])
    parser.add_argument('--seconds', type=float, default=1.5, help='timing per cell')
    parser.add_argument(
        '--budget',
        type=float,
        default=float(os.environ.get('GPU_CHECK_BUDGET', 450)),
        help='seconds; sections that would not fit are skipped, and say so',
    )
    parser.add_argument('--measure-dtypes', nargs='+', default=['bf16', 'fp16'], help='torch dtypes to time')
    args = parser.parse_args()
    check = Check(args.budget)
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    logging.getLogger('clipserve.backends').setLevel(logging.INFO)  # the TensorRT modules' build/load lines
    peak = float(os.environ.get('CLIPSERVE_GPU_PEAK_FLOPS', DEFAULT_PEAK))

    info = environment()
    info['peak_flops'] = peak
    print(json.dumps(info, indent=2), flush=True)
    try:
        importlib.import_module('torch')  # the CPU reference and the export need it
        from clipserve.backends import BackendOptions, create_backend
    except ImportError as e:
        check.skip(
            'everything',
            f'torch or clipserve is not importable in this Python ({e}); '
            'run with the repository .venv (pip install -e ".[torch,onnx-gpu]") or set CLIPSERVE_PYTHON',
        )
        return 0

    print(f'\n== CPU fp32 reference: {args.model}', flush=True)
    cpu = create_backend('torch', args.model, BackendOptions(device='cpu', dtype='fp32'))
    pixels, ids, mask = inputs(cpu.image_size, 16)
    images, texts = embeddings(cpu, pixels, ids, mask)
    reference = {'inputs': (pixels, ids, mask), 'images': images, 'texts': texts}
    del cpu

    print('\n== torch on CUDA', flush=True)
    torch_section(check, args, peak, reference)
    print('\n== ONNX export (CPU)', flush=True)
    try:
        folder = export_for(check, args.model)
    except Exception as e:
        check.fail('onnx export', e)
        folder = None
    print('\n== onnxruntime on CUDA', flush=True)
    onnx_section(check, args, peak, reference, folder)
    print('\n== TensorRT', flush=True)
    tensorrt_section(check, args, peak, reference, folder)

    rows = [
        [
            r['backend'],
            r['dtype'],
            r['input'],
            r['batch'],
            f'{r["items_per_s"]:,.1f}',
            f'{r.get("tflops", 0):.1f}',
            f'{100 * r.get("fraction_of_peak", 0):.2f}%',
        ]
        for r in check.throughput
    ]
    print(f'\n== throughput ({args.model}, model only; peak {peak / 1e12:.0f} TFLOP/s)\n')
    print(markdown_table(['backend', 'dtype', 'input', 'batch', 'items/s', 'TFLOP/s', 'of peak'], rows))
    print('\n== parity (max cosine distance vs CPU fp32)\n')
    print(
        markdown_table(
            ['backend', 'dtype', 'input', 'distance', 'limit', 'ok'],
            [
                [r['backend'], r['dtype'], r['input'], f'{r["max_cosine_distance"]:.2e}', r['limit'], r['ok']]
                for r in check.parity
            ],
        )
    )
    for note in check.notes:
        print(note)
    out_dir = Path(os.environ['OUT']) if os.environ.get('OUT') else Path(__file__).parent / 'results'
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        'model': args.model,
        'environment': info,
        'parity': check.parity,
        'throughput': check.throughput,
        'skipped': check.notes,
        'failures': check.failures,
    }
    (out_dir / 'gpu_check.json').write_text(json.dumps(payload, indent=2, default=str))
    print(f'\nwrote {out_dir / "gpu_check.json"}')
    if check.failures:
        print('\nFAILED:\n  ' + '\n  '.join(check.failures))
        return 1
    print('\nall checks that could run passed')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
