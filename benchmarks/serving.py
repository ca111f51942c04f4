"""Model-only vs served throughput, padding trim, dynamic batching, memory and start-up, in one run.

    .venv/bin/python -m benchmarks.serving [--model ViT-B-32::random] [--backends torch onnx] [--seconds 4] [--rounds 3]

Everything runs on this machine, in one run, so the ratios compare like with like (absolute
numbers move 2-3x with other load on a 2-core machine; the load average is recorded). Every ratio
is bracketed: the baseline (model-only; untrimmed texts; batching off) is measured just before and
just after each window it is compared with, the ratio taken to the mean of the two, and the
median over `--rounds` rounds reported, so a drift in the machine's speed cannot masquerade as
serving overhead. Clients are asyncio clients in this process: on a small machine they still
share the cores with the server. Model-only and
served throughput are both sustained rates (items over elapsed time). The torch replica loads its
weights from a safetensors checkpoint of the in-process model, the onnx replica from an export of
it, as in production; peak memory is the replica's VmHWM after all workloads.
The main table is fp32 on every backend. The precision table then compares, per backend, each
other precision (`--precisions`: torch auto = what a Flow serves by default, bf16 where the
CPU computes bf16 natively; onnx int8) with fp32 of the same backend: both replicas up at once,
model-only and served (1 and 4 clients) for short texts and images, every ratio bracketed by fp32
windows, with the cosine of its embeddings to fp32's; the CPU's bf16 / int8 instructions are printed.
For onnx and short texts, the same rounds also measure the model alone at larger batches and FastEmbed
in-process on the same export (text_rates.py): Flow(4) against the model at its best batch and against
FastEmbed. Just that comparison: `--backends onnx --precisions --workloads short --no-batching`.
Prints tables, writes benchmarks/results/serving.json and serving.png.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

import numpy as np

from benchmarks import plots, text_rates
from benchmarks.common import bracketed, machine, markdown_table, save, sustained_rate
from benchmarks.serving_precision import precision_rows
from benchmarks.serving_workloads import (
    LONG,
    SHORT,
    WORKLOADS,
    cpu_capabilities,
    fp32_torch_model,
    free_port,
    gemm_peak,
    jpeg_640x480,
    model_flops,
    rss_peak_mb,
    save_checkpoint,
    served,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--backends', nargs='+', default=['torch', 'onnx'])
    parser.add_argument('--seconds', type=float, default=4.0, help='length of each measuring window')
    parser.add_argument('--rounds', type=int, default=3, help='windows per measure, taken in turn; medians reported')
    parser.add_argument(
        '--precisions',
        nargs='*',
        default=['torch:auto', 'onnx:int8'],
        help='backend:dtype pairs compared with fp32 of the same backend (none: skip)',
    )
    parser.add_argument('--workloads', nargs='+', choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument(
        '--batching', action=argparse.BooleanOptionalAction, default=True, help='torch Flows, batching on vs off'
    )
    parser.add_argument(
        '--text-rates',
        action=argparse.BooleanOptionalAction,
        default=True,
        help='onnx, short texts: the model at larger batches and FastEmbed, in the same rounds',
    )
    args = parser.parse_args()
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')
    os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')

    from docarray import Document, DocumentArray
    from jina import Client, Flow

    from clipserve import CLIPEncoder
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.backends.onnx.export import export_onnx
    from clipserve.models.names import parse_model_name
    from clipserve.models.preprocess import preprocess_bytes
    from clipserve.models.registry import resolve
    from clipserve.models.tokenizer import Tokenizer

    info = machine()
    # The machine's speed drifts during a run, so the GEMM rate is sampled before every workload
    # and the best sample is the peak (one sample at the start once came out a third low).
    gemm_samples = [gemm_peak()]
    cfg = resolve(parse_model_name(args.model)).model_cfg
    jpeg = jpeg_640x480()
    tokenizer = Tokenizer()
    short_len, long_len = int(tokenizer([SHORT]).lengths[0]), int(tokenizer([LONG]).lengths[0])
    workloads = {
        'short texts': (
            lambda n: DocumentArray([Document(text=SHORT) for _ in range(n)]),
            model_flops(cfg, short_len)[1],
        ),
        'long captions': (
            lambda n: DocumentArray([Document(text=LONG) for _ in range(n)]),
            model_flops(cfg, long_len)[1],
        ),
        'images 640x480': (lambda n: DocumentArray([Document(blob=jpeg) for _ in range(n)]), model_flops(cfg, 0)[0]),
    }
    workdir = tempfile.TemporaryDirectory(prefix='clipserve-bench-')  # removed when the script ends
    onnx_dir = workdir.name
    if 'onnx' in args.backends:
        export_onnx(args.model, onnx_dir)

    results = {'model': args.model, 'machine': info, 'rows': [], 'extra': {}}
    batch = 8
    for backend_name in args.backends:
        options = BackendOptions(device='cpu', dtype='fp32')
        backend = create_backend(
            backend_name, args.model, options, model_path=onnx_dir if backend_name == 'onnx' else None
        )
        model_only = {
            'short texts': lambda: backend.encode_texts(tokenizer([SHORT] * batch).input_ids),
            'long captions': lambda: backend.encode_texts(tokenizer([LONG] * batch).input_ids),
            # includes decoding and preprocessing, as the server does
            'images 640x480': lambda: backend.encode_images(
                np.stack([preprocess_bytes(jpeg, backend.preprocess) for _ in range(batch)])
            ),
        }
        if backend_name == 'torch':
            full = tokenizer([SHORT] * batch)
            untrimmed = type(backend)(args.model, options, trim_padding=False)
            speedup, trim = bracketed(
                lambda: sustained_rate(lambda: untrimmed.encode_texts(full.input_ids), batch, args.seconds),
                {'trimmed': lambda: sustained_rate(model_only['short texts'], batch, args.seconds)},
                args.rounds,
            )
            results['extra']['short_text_trim_speedup'] = speedup['trimmed']
            results['extra']['short_text_untrimmed_per_s'] = trim['baseline']
            del untrimmed

        port = free_port()
        uses_with = {'name': args.model, 'backend': backend_name, 'minibatch_size': 32, 'dtype': 'fp32'}
        if backend_name == 'onnx':
            uses_with['model_path'] = onnx_dir
        else:  # the replica loads its weights from a checkpoint file, as in production
            uses_with['name'] = save_checkpoint(backend.model, parse_model_name(args.model).arch, workdir.name)
        started = time.perf_counter()
        with Flow(port=port).add(uses=CLIPEncoder, uses_with=uses_with, allow_concurrent=True, timeout_ready=-1):
            ready = time.perf_counter() - started
            for name, (docs_fn, flops) in workloads.items():
                if name not in [WORKLOADS[w] for w in args.workloads]:
                    continue
                gemm_samples.append(gemm_peak(1.0))
                compare = args.text_rates and backend_name == 'onnx' and name == 'short texts'
                with text_rates.fastembed(onnx_dir, SHORT) if compare else contextlib.nullcontext() as fe:
                    baseline = lambda: sustained_rate(model_only[name], batch, args.seconds)  # noqa: E731
                    ratios, rates = bracketed(
                        baseline,
                        {
                            1: lambda: served(port, docs_fn, 1, batch, args.seconds),
                            4: lambda: served(port, docs_fn, 4, batch, args.seconds),
                        }
                        | (text_rates.measures(backend, tokenizer, SHORT, args.seconds, fe) if compare else {}),
                        args.rounds,
                    )
                    if compare:
                        results['text_rates'] = text_rates.summary(
                            ratios, rates, baseline, backend, tokenizer, SHORT, batch, args, fe
                        )
                results['rows'].append(
                    {
                        'backend': backend_name,
                        'workload': name,
                        'model_only': rates['baseline'],
                        'flow_1_client': rates[1],
                        'flow_4_clients': rates[4],
                        'overhead_ratio_1': ratios[1],
                        'overhead_ratio_4': ratios[4],
                        'model_flops_per_s': rates['baseline'] * flops,
                    }
                )
            replica = Client(host='127.0.0.1', port=port).post(
                '/clipserve/info', DocumentArray([Document()]), return_responses=True
            )
            pid = int(next(iter(replica[0].parameters['__results__'].values()))['pid'])
            results['extra'][f'{backend_name}_peak_rss_mb'] = rss_peak_mb(pid)
            results['extra'][f'{backend_name}_start_to_ready_s'] = ready
        backend = None  # free the in-process model before the next backend loads

    if args.batching:
        # dynamic batching: 16 clients sending single short texts, batching on vs off (torch); both
        # Flows up at once so the two can be measured in turn
        single = workloads['short texts'][0]
        ports = {'on': free_port(), 'off': free_port()}
        flows = [
            Flow(port=ports[key]).add(
                uses=CLIPEncoder,
                uses_with={'name': args.model, 'batch_requests': key == 'on'},
                allow_concurrent=True,
                timeout_ready=-1,
            )
            for key in ports
        ]
        with flows[0], flows[1]:
            speedup, rates = bracketed(
                lambda: served(ports['off'], single, 16, 1, args.seconds),
                {'on': lambda: served(ports['on'], single, 16, 1, args.seconds)},
                args.rounds,
            )
        results['extra']['batching_on_16_clients_per_s'] = rates['on']
        results['extra']['batching_off_16_clients_per_s'] = rates['baseline']
        results['extra']['batching_speedup'] = speedup['on']

    checkpoints = {
        'torch': save_checkpoint(fp32_torch_model(args.model), parse_model_name(args.model).arch, workdir.name)
    }
    results['precision'] = [
        row
        for pair in args.precisions
        for row in precision_rows(pair, args, workloads, checkpoints.get(pair.partition(':')[0]), onnx_dir)
    ]

    peak = max(gemm_samples)
    results['gemm_peak_gflops'] = peak / 1e9
    results['gemm_samples_gflops'] = [g / 1e9 for g in gemm_samples]
    for row in results['rows']:
        row['peak_fraction'] = row['model_flops_per_s'] / peak
    print(
        f'\n{args.model}, {info["cpu"]}, {info["cores"]} cores, load {info["load_avg"]:.2f}, {info["when"]}; '
        f'fp32 GEMM peak {peak / 1e9:.0f} GFLOP/s (best of {len(gemm_samples)} samples, lowest '
        f'{min(gemm_samples) / 1e9:.0f}); batches of {batch}\n'
    )
    print(
        markdown_table(
            [
                'backend',
                'workload',
                'model-only /s',
                'Flow 1 client /s',
                'Flow 4 clients /s',
                'Flow(1) / model',
                'Flow(4) / model',
                '% of GEMM peak',
            ],
            [
                [
                    r['backend'],
                    r['workload'],
                    f'{r["model_only"]:.1f}',
                    f'{r["flow_1_client"]:.1f}',
                    f'{r["flow_4_clients"]:.1f}',
                    f'{r["overhead_ratio_1"]:.2f}',
                    f'{r["overhead_ratio_4"]:.2f}',
                    f'{100 * r["peak_fraction"]:.0f}%',
                ]
                for r in results['rows']
            ],
        )
    )
    print("(rates: medians over the rounds; ratios: medians of each round's bracketed ratio)")
    print()
    print(markdown_table(['measure', 'value'], [[k, f'{v:.2f}'] for k, v in results['extra'].items()]))
    compared = results.get('text_rates')
    if compared:
        print(text_rates.table(compared))
    if results['precision']:
        print(f'\nPrecision vs fp32 of the same backend; this CPU: {cpu_capabilities()}\n')
        print(
            markdown_table(
                [
                    'backend',
                    'precision',
                    'workload',
                    'model-only /s (x fp32)',
                    'Flow 1 client /s (x fp32)',
                    'Flow 4 clients /s (x fp32)',
                    'min cosine to fp32',
                ],
                [
                    [
                        r['backend'],
                        r['precision'],
                        r['workload'],
                        f'{r["model_only"]:.1f} ({r["model_only_vs_fp32"]:.2f}x)',
                        f'{r["flow_1_client"]:.1f} ({r["flow_1_vs_fp32"]:.2f}x)',
                        f'{r["flow_4_clients"]:.1f} ({r["flow_4_vs_fp32"]:.2f}x)',
                        f'{r["min_cosine"]:.5f}',
                    ]
                    for r in results['precision']
                ],
            )
        )
    path = save('serving', results)

    plots.serving(results, path)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
