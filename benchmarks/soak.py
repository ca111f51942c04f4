"""Long soak on loopback: N clients x M requests of texts and images against one replica; prints a report.

    .venv/bin/python -m benchmarks.soak [--model ViT-B-32::random] [--clients 8] [--requests 500]

The CI variant (4 clients x 50 requests, tiny model) is tests/integration/test_load_and_faults.py.
Reports errors (must be 0), p50/p99 latency and the replica's resident memory after warm-up and at
the end; writes benchmarks/results/soak.json. Stops by itself; talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import io
import os

from benchmarks.common import machine, save
from devkit.load import replica_pids, rss_mb, soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--clients', type=int, default=8)
    parser.add_argument('--requests', type=int, default=500)
    args = parser.parse_args()
    os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')

    import numpy as np
    from docarray import Document, DocumentArray
    from jina import Flow
    from PIL import Image

    from clipserve import CLIPEncoder

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(buf, 'JPEG')
    jpeg = buf.getvalue()

    def docs(i, n):
        return DocumentArray(
            [Document(id=f'{i}-{n}-t', text=f'client {i} request {n}'), Document(id=f'{i}-{n}-i', blob=jpeg)]
        )

    def check(sent, got):
        assert [d.id for d in got] == [d.id for d in sent] and all(d.embedding is not None for d in got)

    flow = Flow().add(uses=CLIPEncoder, uses_with={'name': args.model}, allow_concurrent=True, timeout_ready=-1)
    with flow:
        [pid] = replica_pids(flow.port)
        soak(flow.port, args.clients, 5, docs, check)
        before = rss_mb(pid)
        report = soak(flow.port, args.clients, args.requests, docs, check)
        after = rss_mb(pid)
    report.update(
        rss_after_warmup_mb=before,
        rss_end_mb=after,
        growth=after / before - 1,
        model=args.model,
        machine=machine(),
        error_samples=report['errors'][:5],
        errors=len(report['errors']),
    )
    print(
        f'{report["requests"]} requests ({args.clients} clients) in {report["seconds"]:.0f} s: '
        f'{report["errors"]} errors, p50 {report["p50_ms"]:.0f} ms, p99 {report["p99_ms"]:.0f} ms, '
        f'RSS {before:.0f} -> {after:.0f} MB ({100 * report["growth"]:+.1f} %)'
    )
    print(f'wrote {save("soak", report)}')


if __name__ == '__main__':
    main()
