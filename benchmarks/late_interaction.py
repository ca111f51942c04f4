"""Late interaction (ColQwen2, ColPali): pages/s and queries/s, model-only and served; ranking vs transformers; storage.

    .venv/bin/python -m benchmarks.late_interaction --size tiny                  # smoke run, 1-2 minutes
    .venv/bin/python -m benchmarks.late_interaction --size real [--kinds colqwen2 colpali] [--pages 8]

Checkpoints with seeded random weights are built here (late_interaction_models.py: the real architectures'
sizes with `--size real`, the tests' tiny widths with `--size tiny`). For each model:

- model-only: pages/s (JPEG pages of rendered text, tables and charts, decoded and preprocessed as served,
  then the forward pass) and queries/s (batches of 8) through clipserve's torch backend at `--dtype` (auto:
  bf16 where the CPU computes it natively, else fp32), the parameter count, the process's peak RSS (VmHWM);
- served: the same model behind the shipped flows/multi-protocol.yml (CLIPSERVE_MODEL=transformers:<folder>,
  CLIPSERVE_DTYPE), over gRPC with clipserve_client.jina's Client (`multi_vector: true`): pages/s, queries/s
  and the executor process's VmHWM (`--no-served` skips it);
- the check: for the first `--check` queries and pages, transformers' own processor and model (in the same
  precision) give `score_retrieval`; MaxSim of the served vectors and the served /rank (stored vectors
  reused) must order the pages as it does. bf16 rounds differently on the two paths: pages whose scores
  differ by less than that rounding may swap, and the table says how far apart the swapped ones were.

The storage table (`--quality-size`, one model in fp32): top-10 agreement with fp32 unpooled MaxSim (the
share of the reference's ten best pages a variant also ranks in its ten best, mean over queries) of token
pooling (pool_factor 2, 3, 4: engine/token_pooling.py) and of fp16 / int8 storage (engine/vector_storage.py),
with bytes per page. At random weights these say how much each variant perturbs rankings of this
architecture, not how a trained model's retrieval quality changes. Writes benchmarks/results/late_interaction.json
and late_interaction.png.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import plots
from benchmarks.common import machine, markdown_table, save
from benchmarks.late_interaction_models import (
    KINDS,
    build_in_subprocess,
    compare_orders,
    pages,
    queries,
    transformers_scores,
)

ROOT = Path(__file__).resolve().parents[1]
MULTI = {'multi_vector': True}
QUERY_BATCH = 8


def proc_mb(field: str, pid: int | str = 'self') -> float | None:
    """VmRSS / VmHWM of a process in MB (None where /proc cannot tell)."""
    try:
        with open(f'/proc/{pid}/status') as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ':')) / 1024
    except (OSError, StopIteration):
        return None


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: clear_refs 5), so each phase has its own peak."""
    try:
        Path('/proc/self/clear_refs').write_text('5')
    except OSError:
        pass


def timed(fn, items: int, min_seconds: float):
    """fn() back to back until `min_seconds` have passed (at least once): (items per second, the last result)."""
    started, runs = time.perf_counter(), 0
    while True:
        result = fn()
        runs += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return runs * items / elapsed, result


def model_only(folder: Path, args, page_data: list[bytes], texts: list[str]):
    """(figures, page vectors, query vectors) of clipserve's torch backend, in this process."""
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.engine.token_vectors import token_rows
    from clipserve.models.preprocess import preprocess_bytes

    reset_peak()
    started = time.perf_counter()
    options = BackendOptions(device=args.device, dtype=None if args.dtype == 'auto' else args.dtype)
    backend = create_backend('torch', f'transformers:{folder}', options)
    load_seconds = time.perf_counter() - started

    def encode_pages(data):
        pixels = np.stack([preprocess_bytes(d, backend.preprocess) for d in data])
        return token_rows(backend.encode_images(pixels))

    def encode_queries(batch):
        tokens = backend.tokenizer(batch)
        return token_rows(backend.encode_texts(tokens.input_ids, tokens.attention_mask))

    encode_pages(page_data[:1]), encode_queries(texts[:1])  # warm-up
    page_rate, page_vectors = timed(lambda: encode_pages(page_data), len(page_data), args.seconds)
    batches = [texts[i : i + QUERY_BATCH] for i in range(0, len(texts), QUERY_BATCH)]
    query_rate, query_vectors = timed(lambda: [v for b in batches for v in encode_queries(b)], len(texts), args.seconds)
    figures = {
        'dtype': backend.dtype,
        'precision': backend.precision.reason,
        'device': backend.device,
        'parameters': int(sum(p.numel() for p in backend.model.parameters())),
        'load_seconds': load_seconds,
        'pages_per_s': page_rate,
        'queries_per_s': query_rate,
        'vectors_per_page': float(np.mean([len(v) for v in page_vectors])),
        'vectors_per_query': float(np.mean([len(v) for v in query_vectors])),
        'peak_rss_mb': proc_mb('VmHWM'),
    }
    backend.close()
    return figures, page_vectors, query_vectors


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def served(folder: Path, args, page_data: list[bytes], texts: list[str], check: int, workdir: Path):
    """(figures, page vectors, query vectors, /rank's maxsim_score [check queries, check pages]) of a Flow
    from flows/multi-protocol.yml serving `folder`, over gRPC."""
    import yaml
    from docarray import Document, DocumentArray
    from jina import Client as JinaClient
    from jina import Flow

    from clipserve_client.jina import Client

    config = yaml.safe_load((ROOT / 'flows' / 'multi-protocol.yml').read_text())
    ports = [free_port() for _ in config['gateway']['protocol']]
    config['gateway']['port'] = ports
    path = workdir / 'multi-protocol.yml'
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {'CLIPSERVE_MODEL': f'transformers:{folder}', 'CLIPSERVE_DTYPE': args.dtype}
    if args.device:
        env['CLIPSERVE_DEVICE'] = args.device
    os.environ.update(env)  # read when Jina loads the file
    started = time.perf_counter()
    with Flow.load_config(str(path)):
        ready = time.perf_counter() - started
        info = JinaClient(host='127.0.0.1', port=ports[0]).post(
            '/clipserve/info', DocumentArray([Document()]), return_responses=True
        )
        pid = int(next(iter(info[0].parameters['__results__'].values()))['pid'])
        client = Client(f'grpc://127.0.0.1:{ports[0]}')
        client.encode(page_data[:1], parameters=MULTI), client.encode(texts[:1], parameters=MULTI)  # warm-up

        def page_pass():  # two requests in flight: the replica always has the next pages, none waits long
            return client.encode(page_data, batch_size=args.page_batch, parameters=MULTI, prefetch=2)

        page_rate, page_vectors = timed(page_pass, len(page_data), args.seconds)
        query_rate, query_vectors = timed(
            lambda: client.encode(texts, batch_size=QUERY_BATCH, parameters=MULTI), len(texts), args.seconds
        )
        # /rank of stored vectors (reuse_embeddings): the query is encoded by the server, the pages are not
        docs = DocumentArray(
            Document(text=q, matches=[Document(id=f'p{i}', embedding=page_vectors[i]) for i in range(check)])
            for q in texts[:check]
        )
        ranked = JinaClient(host='127.0.0.1', port=ports[0]).post(
            '/rank', docs, parameters={'reuse_embeddings': True, **MULTI}
        )
        rank_scores = np.array(
            [[{m.id: m.scores['maxsim_score'].value for m in d.matches}[f'p{i}'] for i in range(check)] for d in ranked]
        )
        peak = proc_mb('VmHWM', pid)
    figures = {'pages_per_s': page_rate, 'queries_per_s': query_rate, 'start_to_ready_s': ready}
    figures['executor_peak_rss_mb'] = peak
    return figures, page_vectors, query_vectors, rank_scores


def measure_model(kind: str, args, workdir: Path) -> dict:
    from clipserve.engine import ranking

    folder = args.checkpoints / f'{kind}-{args.size}'
    build = build_in_subprocess(folder, kind, args.size, 'bf16' if args.size == 'real' else 'fp32')
    page_data, texts = pages(args.pages, seed=3), queries(args.queries, seed=4)
    result = {'kind': kind, 'size': args.size, 'build': build, 'pages': len(page_data), 'queries': len(texts)}
    result['model_only'], page_vectors, query_vectors = model_only(folder, args, page_data, texts)
    gc.collect()
    check = min(args.check, len(page_data), len(texts))
    dtype, device = result['model_only']['dtype'], result['model_only']['device']
    want = transformers_scores(folder, kind, dtype, page_data[:check], texts[:check], device)
    gc.collect()
    checks = {'model-only MaxSim': ranking.maxsim(query_vectors[:check], page_vectors[:check])}
    if args.served:
        result['served'], served_pages, served_queries, rank_scores = served(
            folder, args, page_data, texts, check, workdir
        )
        checks['served MaxSim'] = ranking.maxsim(served_queries[:check], served_pages[:check])
        checks['served /rank'] = rank_scores
        rows = zip([*page_vectors, *query_vectors], [*served_pages, *served_queries])
        result['served']['max_vector_diff_to_model_only'] = max(float(np.abs(a - b).max()) for a, b in rows)
    result['check'] = {label: compare_orders(want, scores) for label, scores in checks.items()}
    return result


def storage_effect(args) -> dict:
    """Top-10 agreement with fp32 unpooled MaxSim, and bytes per page, of pooled and quantized page vectors."""
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.engine import ranking, vector_storage
    from clipserve.engine.token_pooling import pool_tokens
    from clipserve.engine.token_vectors import token_rows
    from clipserve.models.preprocess import preprocess_bytes

    kind, size = args.quality_kind, args.quality_size
    folder = args.checkpoints / f'{kind}-{size}'
    build_in_subprocess(folder, kind, size, 'bf16' if size == 'real' else 'fp32')
    backend = create_backend('torch', f'transformers:{folder}', BackendOptions(device=args.device, dtype='fp32'))
    texts = queries(args.quality_queries, seed=7)
    tokens = backend.tokenizer(texts)
    query_vectors = token_rows(backend.encode_texts(tokens.input_ids, tokens.attention_mask))
    page_vectors = []
    for start in range(0, args.quality_pages, 16):
        data = pages(min(16, args.quality_pages - start), seed=1000 + start)
        page_vectors += token_rows(
            backend.encode_images(np.stack([preprocess_bytes(d, backend.preprocess) for d in data]))
        )
    backend.close()
    reference_scores = ranking.maxsim(query_vectors, page_vectors)
    k = min(10, len(page_vectors))
    want, want_first = np.argsort(-reference_scores, axis=1, kind='stable')[:, :k], reference_scores.argmax(axis=1)

    def row(label: str, stored: list, seconds: float = 0.0) -> dict:
        vectors = [vector_storage.load(s) for s in stored]
        scores = ranking.maxsim(query_vectors, vectors)
        ours = np.argsort(-scores, axis=1, kind='stable')[:, :k]
        agreement = np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, want)])
        return {
            'variant': label,
            'vectors_per_page': float(np.mean([len(v) for v in vectors])),
            'bytes_per_page': float(np.mean([s.nbytes for s in stored])),
            'top10_agreement': float(agreement),
            'top1_agreement': float(np.mean(scores.argmax(axis=1) == want_first)),
            'ms_per_page': 1000 * seconds / len(stored),
        }

    rows = [row('fp32 (reference)', [vector_storage.store(v, 'fp32') for v in page_vectors])]
    pooled = {}
    for factor in (2, 3, 4):
        started = time.perf_counter()
        pooled[factor] = [pool_tokens(v, factor) for v in page_vectors]
        seconds = time.perf_counter() - started
        rows.append(row(f'pool_factor {factor}', [vector_storage.store(v, 'fp32') for v in pooled[factor]], seconds))
    for dtype in ('fp16', 'int8'):
        rows.append(row(dtype, [vector_storage.store(v, dtype) for v in page_vectors]))
    rows.append(row('pool_factor 3 + int8', [vector_storage.store(v, 'int8') for v in pooled[3]]))
    dim = int(page_vectors[0].shape[1])
    return {'kind': kind, 'size': size, 'dim': dim, 'pages': len(page_vectors), 'queries': len(texts), 'rows': rows}


def _mb(value) -> str:
    return 'n/a' if value is None else f'{value:.0f}'


def _rate(value: float) -> str:
    return f'{value:,.0f}' if value >= 100 else f'{value:.3g}'


def report(results: dict) -> None:
    speed, check = [], []
    for r in results['models']:
        m, s = r['model_only'], r.get('served')
        row = [f'{r["kind"]} ({r["size"]})', f'{m["parameters"] / 1e6:,.1f} M', m['dtype']]
        row += [f'{m["vectors_per_page"]:.0f} / {m["vectors_per_query"]:.0f}', _rate(m['pages_per_s'])]
        row += [_rate(m['queries_per_s']), _rate(s['pages_per_s']) if s else 'not run']
        row += [_rate(s['queries_per_s']) if s else 'not run', _mb(m['peak_rss_mb'])]
        speed.append(row + [_mb(s['executor_peak_rss_mb']) if s else 'not run'])
        for label, c in r['check'].items():
            n = c['queries']
            equal = f'{c["orders_equal"]}/{n} exactly, {c["equal_up_to_rounding"]}/{n} up to rounding'
            check.append([r['kind'], label, f'{n} x {n}', equal, f'{c["max_relative_diff"]:.2e}'])
    if speed:
        headers = ['model', 'parameters', 'dtype', 'vectors per page / query', 'model-only pages/s']
        headers += ['model-only queries/s', 'served pages/s', 'served queries/s', 'peak RSS model-only MB']
        print(markdown_table(headers + ['peak RSS executor MB'], speed))
        print("\nRanking against transformers' score_retrieval (each query's order of the pages checked):")
        print(markdown_table(['model', 'scores', 'queries x pages', 'orders equal', 'max relative score diff'], check))
    quality = results.get('storage')
    if quality:
        print(
            f'\nStorage and pooling ({quality["kind"]} {quality["size"]}, {quality["dim"]}-d, {quality["pages"]} '
            f'pages, {quality["queries"]} queries, random weights), against fp32 unpooled MaxSim:'
        )
        rows = [
            [q['variant'], f'{q["vectors_per_page"]:.1f}', f'{q["bytes_per_page"]:,.0f}', f'{q["top10_agreement"]:.3f}']
            + [f'{q["top1_agreement"]:.3f}', f'{q["ms_per_page"]:.1f}' if q['ms_per_page'] else '']
            for q in quality['rows']
        ]
        headers = ['storage', 'vectors per page', 'bytes per page', 'top-10 agreement', 'top-1 agreement']
        print(markdown_table(headers + ['pooling ms per page'], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--size', choices=('tiny', 'real'), default='tiny', help='tiny: smoke run; real: 2-3 B models')
    parser.add_argument('--kinds', nargs='*', choices=KINDS, default=list(KINDS), help='none: the storage table only')
    parser.add_argument('--dtype', choices=('auto', 'fp32', 'bf16', 'fp16'), default='auto')
    parser.add_argument('--device', help='cpu, cuda, ...; default: CUDA where present, else the CPU')
    parser.add_argument('--pages', type=int, help='pages measured (default: 16 tiny, 8 real)')
    parser.add_argument('--queries', type=int, help='queries measured (default: 32 tiny, 16 real)')
    parser.add_argument('--page-batch', type=int, default=2, help='pages per served request')
    parser.add_argument('--check', type=int, help='queries and pages checked against transformers (16 / 3)')
    parser.add_argument('--seconds', type=float, default=2.0, help='shortest measuring window (one pass at least)')
    parser.add_argument('--served', action=argparse.BooleanOptionalAction, default=True, help='measure a Flow too')
    parser.add_argument('--quality', action=argparse.BooleanOptionalAction, default=True, help='the storage table')
    parser.add_argument('--quality-size', choices=('tiny', 'small', 'real'), help='default: tiny, or small for real')
    parser.add_argument('--quality-kind', choices=KINDS, default='colqwen2')
    parser.add_argument('--quality-pages', type=int, default=200)
    parser.add_argument('--quality-queries', type=int, default=50)
    parser.add_argument(
        '--checkpoints', type=Path, help='build (or reuse) checkpoints here; default: a temporary folder'
    )
    args = parser.parse_args()
    real = args.size == 'real'
    args.pages = args.pages or (8 if real else 16)
    args.queries = args.queries or (16 if real else 32)
    args.check = args.check or (3 if real else 16)
    args.quality_size = args.quality_size or ('small' if real else 'tiny')
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')
    os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')  # torch ran here first: forked executors can hang
    os.environ.setdefault('TRANSFORMERS_VERBOSITY', 'error')
    workdir = Path(tempfile.mkdtemp(prefix='clipserve-late-'))
    args.checkpoints = args.checkpoints or workdir
    args.checkpoints.mkdir(parents=True, exist_ok=True)

    import jina  # noqa: F401 - first: it sets the start method, and clipserve then registers its executors

    from clipserve.backends.cpu_features import cpu_features

    started = time.perf_counter()
    try:
        results = {'machine': machine(), 'cpu': cpu_features().describe(), 'size': args.size, 'dtype': args.dtype}
        results['models'] = []
        for kind in args.kinds:
            results['models'].append(measure_model(kind, args, workdir))
            if args.checkpoints == workdir and not (
                args.quality and (kind, args.size) == (args.quality_kind, args.quality_size)
            ):
                shutil.rmtree(workdir / f'{kind}-{args.size}', ignore_errors=True)  # 4-6 GB each at real size
        if args.quality:
            results['storage'] = storage_effect(args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results['seconds'] = time.perf_counter() - started
    info = results['machine']
    print(
        f'\n{args.size} size, {info["cpu"]}, {info["cores"]} cores, CPU: {results["cpu"]}, load {info["load_avg"]:.1f}'
    )
    report(results)
    path = save('late_interaction', results)
    plots.late_interaction(results, path)
    print(f'wrote {path} ({results["seconds"]:.0f} s)')


if __name__ == '__main__':
    main()
