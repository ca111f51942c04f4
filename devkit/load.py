"""A bounded load generator for soak tests (CI variant in tests/, long variant in benchmarks/soak.py).

Loopback only, a fixed number of requests per client, stops by itself. Reports errors, latency
percentiles and the executor replica's resident memory before and after.
"""

from __future__ import annotations

import threading
import time

import numpy as np


def rss_mb(pid: int) -> float:
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('VmRSS')) / 1024


def replica_pids(port: int) -> list[int]:
    from docarray import Document, DocumentArray
    from jina import Client

    responses = Client(host='127.0.0.1', port=port).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    return [int(v['pid']) for v in responses[0].parameters['__results__'].values()]


def soak(port: int, clients: int, requests_per_client: int, make_docs, check) -> dict:
    """Run `clients` threads, each sending `requests_per_client` requests; `check(sent, got)` validates answers."""
    from jina import Client

    latencies, errors, lock = [], [], threading.Lock()

    def run(i):
        client = Client(host='127.0.0.1', port=port)
        for n in range(requests_per_client):
            docs = make_docs(i, n)
            started = time.perf_counter()
            try:
                out = client.post('/', docs)
                check(docs, out)
            except Exception as e:  # counted, not raised: the report says how many
                with lock:
                    errors.append(f'{type(e).__name__}: {e}'[:300])
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    [t.start() for t in threads]
    [t.join() for t in threads]
    elapsed = time.perf_counter() - started
    lat = np.array(latencies) if latencies else np.array([float('nan')])
    return {
        'requests': clients * requests_per_client,
        'errors': errors,
        'seconds': elapsed,
        'p50_ms': float(np.percentile(lat, 50) * 1000),
        'p99_ms': float(np.percentile(lat, 99) * 1000),
    }
