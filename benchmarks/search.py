"""Search on the embedded Qdrant engine: recall@10 against exact search, queries per second for a few
`ef_search` values, build time and memory per million vectors (with and without int8 quantization), a real
embedding set from a model, and a text query end to end through flows/search.yml (encode + search).

    python -m benchmarks.search                       # 1,000,000 vectors (about half an hour on 2 cores)
    python -m benchmarks.search --vectors 50000 --real 2000 --no-flow    # a quick look

The synthetic set (`--vectors`, 512-d): 1,000 cluster centres drawn from N(0, I), each point a centre plus
N(0, 0.8^2 I) noise, L2-normalised (numpy's PCG64, seed 0; the queries are 1,000 more points of the same
draw, seed 1). Uniformly random vectors are HNSW's worst case and no embedding looks like them; clustered ones
are closer to what an encoder gives. The exact top 10 is computed by brute force, chunk by chunk. Each
configuration builds in a process of its own with the indexer's defaults (m 16, ef_construction 200), then is
opened and searched in a fresh one, whose memory growth is the memory serving it takes. The real set
(`--real`): captions embedded by `--model` (random weights unless a checkpoint is named), searched with other
captions. The end-to-end run also times `/encode` of the same texts through the same Flow, which tells the
encoding's share. Prints a table, writes benchmarks/results/search.json and a recall/QPS plot next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import plots
from benchmarks.common import machine, markdown_table, save

DIM = 512
CLUSTERS = 1000
NOISE = 0.8
CHUNK = 50_000
K = 10


def synthetic(count: int, seed: int):
    """(first row, rows) chunks of `count` points of the clustered set (see the module's docstring)."""
    centres = np.random.default_rng(12345).normal(size=(CLUSTERS, DIM)).astype(np.float32)
    rng = np.random.default_rng(seed)
    for first in range(0, count, CHUNK):
        n = min(CHUNK, count - first)
        labels = rng.integers(0, CLUSTERS, n)
        noise = rng.normal(scale=NOISE, size=(n, DIM)).astype(np.float32)
        chunk = centres[labels] + noise
        chunk /= np.linalg.norm(chunk, axis=1, keepdims=True)
        yield first, chunk


def exact_top_k(queries: np.ndarray, chunks, k: int = K) -> np.ndarray:
    """The ids of each query's k nearest (cosine) rows, by brute force over the chunks."""
    best_ids = np.zeros((len(queries), 0), dtype=np.int64)
    best_sims = np.zeros((len(queries), 0), dtype=np.float32)
    for first, chunk in chunks:
        sims = queries @ chunk.T
        ids = np.arange(first, first + len(chunk))[None].repeat(len(queries), 0)
        sims, ids = np.concatenate([best_sims, sims], 1), np.concatenate([best_ids, ids], 1)
        keep = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        best_sims, best_ids = np.take_along_axis(sims, keep, 1), np.take_along_axis(ids, keep, 1)
    return best_ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def rss_bytes() -> int:
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith('VmRSS'))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob('*') if p.is_file())


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))


def measure_searches(store, queries, truth, efs) -> list[dict]:
    rows = []
    for ef in efs:
        store.search([queries[0]], K, ef=ef)  # warm
        started = time.perf_counter()
        found = [[int(h.document_id) for h in store.search([q], K, ef=ef)[0]] for q in queries]
        seconds = time.perf_counter() - started
        rows.append({'ef_search': ef, 'recall_at_10': recall(found, truth), 'qps': len(queries) / seconds})
    return rows


# ---- one configuration, in a process of its own -------------------------------------------------------


def build(args) -> dict:
    """Write every vector and build the graph, in a process of its own; the index is left on disk."""
    from clipserve.index.edge import EdgeStore
    from clipserve.index.points import Point
    from clipserve.index.store import CollectionSettings

    folder = Path(args.folder)
    shutil.rmtree(folder, ignore_errors=True)
    store = EdgeStore(folder, CollectionSettings(dim=DIM, quantization=args.quantization))
    started = time.perf_counter()
    for first, chunk in synthetic(args.vectors, seed=0):
        for at in range(0, len(chunk), 2000):
            rows = chunk[at : at + 2000]
            store.upsert([Point(str(first + at + i), v, {}) for i, v in enumerate(rows)])
    upsert_seconds = time.perf_counter() - started
    started = time.perf_counter()
    store.optimize()
    optimize_seconds = time.perf_counter() - started
    indexed = store.status()['indexed']
    store.close()
    seconds = {'upsert_seconds': upsert_seconds, 'optimize_seconds': optimize_seconds}
    return {**seconds, 'indexed': indexed, 'disk_bytes': folder_bytes(folder)}


def serve(args) -> dict:
    """Open the built index in a fresh process and search it: recall, speed, and the memory serving it takes
    (the process's resident memory growth: the graph, the vectors searching touched, the payloads)."""
    from clipserve.index.edge import EdgeStore

    queries = next(synthetic(args.queries, seed=1))[1]
    truth = exact_top_k(queries, synthetic(args.vectors, seed=0))
    before = rss_bytes()
    store = EdgeStore(Path(args.folder))
    searches = measure_searches(store, queries, truth, args.efs)
    grown = rss_bytes() - before
    store.close()
    return {'searches': searches, 'rss_bytes': grown}


def build_and_measure(args) -> dict:
    return {'quantization': args.quantization, 'vectors': args.vectors, **build(args)}


def real_embeddings(args) -> dict:
    """Captions embedded by the model, searched with other captions: recall of the default settings."""
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.index.edge import EdgeStore
    from clipserve.index.points import Point
    from clipserve.index.store import CollectionSettings
    from clipserve.models.names import parse_model_name

    backend = create_backend(
        'onnx' if args.backend == 'onnx' else 'torch', parse_model_name(args.model), BackendOptions()
    )
    words = ['dog', 'cat', 'car', 'tree', 'house', 'boat', 'bird', 'street', 'beach', 'mountain', 'child', 'table']
    rng = np.random.default_rng(7)

    def captions(n):
        return [' '.join(rng.choice(words, size=int(rng.integers(3, 9)))) + f' {rng.integers(1000)}' for _ in range(n)]

    def embed(texts):
        out = []
        for i in range(0, len(texts), 64):
            tokens = backend.tokenizer(texts[i : i + 64])
            out.append(backend.encode_texts(tokens.input_ids, tokens.attention_mask))
        out = np.concatenate(out)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    corpus, queries = embed(captions(args.real)), embed(captions(min(500, args.real // 10 or 1)))
    truth = exact_top_k(queries, [(0, corpus)])
    folder = Path(args.folder)
    shutil.rmtree(folder, ignore_errors=True)
    store = EdgeStore(folder, CollectionSettings(dim=corpus.shape[1]))
    store.upsert([Point(str(i), v, {}) for i, v in enumerate(corpus)])
    store.optimize()
    searches = measure_searches(store, queries, truth, args.efs)
    store.close()
    backend.close()
    return {'model': args.model, 'vectors': len(corpus), 'dim': int(corpus.shape[1]), 'searches': searches}


# ---- end to end: a text query through flows/search.yml -----------------------------------------------

QUERY_CLIENT = """
import json, sys, time
from docarray import Document, DocumentArray
from jina import Client
client = Client(host='127.0.0.1', port=int(sys.argv[1]))
endpoint = sys.argv[3]
latencies = []
for i in range(int(sys.argv[2])):
    started = time.perf_counter()
    out = client.post(endpoint, DocumentArray([Document(text=f'a photo of a dog number {i}')]), parameters={'limit': 10})
    latencies.append(time.perf_counter() - started)
    assert endpoint != '/search' or len(out[0].matches) == 10
print(json.dumps(latencies[5:]))
"""


def end_to_end(args, index_folder: Path) -> list[dict]:
    import yaml

    root = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((root / 'flows' / 'search.yml').read_text())
    ports = [free_port() for _ in range(3)]
    config['gateway']['port'] = ports
    work = Path(tempfile.mkdtemp(prefix='clipserve-search-flow-'))
    (work / 'flow.yml').write_text(yaml.safe_dump(config, sort_keys=False))
    env = {
        **os.environ,
        'CLIPSERVE_MODEL': args.model,
        'CLIPSERVE_INDEX_PATH': str(index_folder),
        'JINA_LOG_LEVEL': 'ERROR',
    }
    jina = str(Path(sys.executable).parent / 'jina')
    log = open(work / 'flow.log', 'w')
    flow = subprocess.Popen(
        [jina, 'flow', '--uses', str(work / 'flow.yml')],
        env=env,
        cwd=work,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    rows = []
    try:
        from jina import Client

        deadline = time.monotonic() + 600
        while not Client(host='127.0.0.1', port=ports[0]).is_flow_ready(timeout=1):
            if flow.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((work / 'flow.log').read_text()[-3000:])
            time.sleep(1)
        for endpoint in ('/search', '/encode'):
            for clients in (1, 4):
                command = [sys.executable, '-c', QUERY_CLIENT, str(ports[0]), str(args.flow_queries + 5), endpoint]
                procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
                latencies = sum((json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs), [])
                latencies.sort()
                rows.append(
                    {
                        'endpoint': endpoint,
                        'clients': clients,
                        'p50_ms': 1000 * statistics.median(latencies),
                        'p99_ms': 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                        'queries': len(latencies),
                    }
                )
    finally:
        os.killpg(flow.pid, 9)  # every process of the Flow; the index is a throw-away copy
        flow.wait()
        shutil.rmtree(work, ignore_errors=True)
    return rows


# ---- the whole run -----------------------------------------------------------------------------------


def child(args, stage: str, **overrides) -> dict:
    command = [
        sys.executable,
        '-m',
        'benchmarks.search',
        '--stage',
        stage,
        '--vectors',
        str(args.vectors),
        '--queries',
        str(args.queries),
    ]
    command += ['--efs', ','.join(map(str, args.efs)), '--model', args.model, '--real', str(args.real)]
    for key, value in overrides.items():
        command += [f'--{key}', str(value)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--vectors', type=int, default=1_000_000)
    parser.add_argument('--queries', type=int, default=1000)
    parser.add_argument('--efs', type=lambda s: [int(x) for x in s.split(',')], default=[16, 32, 64, 128, 256])
    parser.add_argument('--quantizations', default='none,int8')
    parser.add_argument('--real', type=int, default=10_000, help='captions in the real-embedding set (0: none)')
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--backend', default='torch')
    parser.add_argument('--no-flow', action='store_true', help='skip the end-to-end Flow measurement')
    parser.add_argument('--flow-queries', type=int, default=200)
    parser.add_argument(
        '--flow-backend', default='onnx', help="the search Flow's encoder backend (default %(default)s)"
    )
    parser.add_argument('--stage', default='all', help=argparse.SUPPRESS)
    parser.add_argument('--quantization', default='none', help=argparse.SUPPRESS)
    parser.add_argument('--folder', default='', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == 'build':
        print(json.dumps(build_and_measure(args)))
        return
    if args.stage == 'serve':
        print(json.dumps(serve(args)))
        return
    if args.stage == 'real':
        print(json.dumps(real_embeddings(args)))
        return

    work = Path(tempfile.mkdtemp(prefix='clipserve-search-bench-'))
    results = {'machine': machine(), 'vectors': args.vectors, 'generator': __doc__.split('\n\n')[2], 'builds': []}
    try:
        for quantization in args.quantizations.split(','):
            folder = work / f'index-{quantization}'
            build = child(args, 'build', quantization=quantization, folder=folder)
            build.update(child(args, 'serve', folder=folder))
            results['builds'].append(build)
            seconds = f'{build["upsert_seconds"]:.0f} s + graph {build["optimize_seconds"]:.0f} s'
            print(f'{quantization}: built {args.vectors:,} in {seconds}', flush=True)
        if args.real:
            results['real'] = child(args, 'real', folder=work / 'real', backend=args.backend)
        if not args.no_flow:
            results['flow'] = end_to_end(args, work / 'index-none')
            results['flow_model'] = f'{args.model} on {args.flow_backend}'
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)


def report(results: dict) -> None:
    per_million = 1_000_000 / results['vectors']
    rows = []
    for build in results['builds']:
        for s in build['searches']:
            rows.append(
                [
                    build['quantization'],
                    s['ef_search'],
                    f'{s["recall_at_10"]:.3f}',
                    f'{s["qps"]:.0f}',
                    f'{build["upsert_seconds"]:.0f} + {build["optimize_seconds"]:.0f}',
                    f'{build["rss_bytes"] * per_million / 2**20:.0f}',
                    f'{build["disk_bytes"] * per_million / 2**20:.0f}',
                ]
            )
    print(f'\n{results["vectors"]:,} clustered 512-d vectors, 1,000 queries, one thread of queries')
    print(
        markdown_table(
            [
                'quantization',
                'ef_search',
                'recall@10',
                'queries/s',
                'build s (write + graph)',
                'RSS MiB / 1M',
                'disk MiB / 1M',
            ],
            rows,
        )
    )
    if 'real' in results:
        real = results['real']
        print(f'\n{real["vectors"]:,} captions embedded by {real["model"]} ({real["dim"]}-d)')
        print(
            markdown_table(
                ['ef_search', 'recall@10', 'queries/s'],
                [[s['ef_search'], f'{s["recall_at_10"]:.3f}', f'{s["qps"]:.0f}'] for s in real['searches']],
            )
        )
    if 'flow' in results:
        print(
            f'\nA text query end to end through flows/search.yml ({results["flow_model"]}), gRPC: /search (encode + '
            'search over the first index) and /encode alone (the same texts through the same Flow)'
        )
        rows = [
            [r['endpoint'], r['clients'], f'{r["p50_ms"]:.1f}', f'{r["p99_ms"]:.1f}', r['queries']]
            for r in results['flow']
        ]
        print(markdown_table(['endpoint', 'clients', 'p50 ms', 'p99 ms', 'queries'], rows))
    path = save('search', results)

    plots.search(results, path)
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
