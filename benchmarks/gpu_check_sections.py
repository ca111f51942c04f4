"""benchmarks/gpu_check.py's sections, one per backend: torch on CUDA, the ONNX export and onnxruntime on CUDA,
TensorRT (engines for clipserve-tiny, then the model itself). Each records into the Check and skips what
cannot run here, saying why."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_check_measure import TINY, Check, embeddings, inputs, measure


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
    from clipserve.backends.onnx.export import export_to_cache

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
