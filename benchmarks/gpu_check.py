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
from pathlib import Path

from benchmarks.common import machine, markdown_table
from benchmarks.gpu_check_measure import DEFAULT_PEAK, Check, embeddings, inputs
from benchmarks.gpu_check_sections import export_for, onnx_section, tensorrt_section, torch_section


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
