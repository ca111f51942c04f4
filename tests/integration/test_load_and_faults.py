"""Bounded load on loopback: a short soak (zero errors, memory flat) and a replica killed mid-load."""

import os
import signal
import threading
import time

from docarray import Document, DocumentArray
from jina import Client, Flow

from clipserve import CLIPEncoder
from devkit.load import replica_pids, rss_mb, soak

from ..waiting import wait_until
from .conftest import TINY, make_image


def _docs(i, n, texts=3, images=1):
    return DocumentArray(
        [Document(id=f'{i}-{n}-{k}', text=f'client {i} request {n} doc {k}') for k in range(texts)]
        + [Document(id=f'{i}-{n}-img{k}', blob=make_image(seed=(n + k) % 5)) for k in range(images)]
    )


def _check(sent, got):
    assert [d.id for d in got] == [d.id for d in sent]
    assert all(d.embedding is not None and d.embedding.shape == (64,) for d in got)


def test_soak_short_variant():
    flow = Flow().add(uses=CLIPEncoder, uses_with={'name': TINY}, allow_concurrent=True)
    with flow:
        [pid] = replica_pids(flow.port)
        soak(flow.port, 4, 10, _docs, _check)  # warm-up: caches, thread pools, allocator
        before = rss_mb(pid)
        report = soak(flow.port, 4, 50, _docs, _check)
        after = rss_mb(pid)
    print(
        f'\nsoak: {report["requests"]} requests in {report["seconds"]:.1f}s, errors {len(report["errors"])}, '
        f'p50 {report["p50_ms"]:.1f} ms, p99 {report["p99_ms"]:.1f} ms, rss {before:.0f} -> {after:.0f} MB'
    )
    assert report['errors'] == []
    assert after < before * 1.10, f'resident memory grew from {before:.0f} to {after:.0f} MB'


def _info(port):
    responses = Client(host='127.0.0.1', port=port).post(
        '/clipserve/info', DocumentArray([Document()]), return_responses=True
    )
    return next(iter(responses[0].parameters['__results__'].values()))


def test_killing_a_replica_mid_load_loses_nothing_silently():
    """The victim is frozen (SIGSTOP) under load, so a request the gateway sends it waits there: one that
    has been outstanding many times longer than the live replica takes is in flight at the victim when
    SIGKILL comes."""
    # timeout_ctrl: Jina's close waits this long for the killed replica's shutdown signal, which never comes
    flow = Flow().add(uses=CLIPEncoder, uses_with={'name': TINY}, replicas=2, allow_concurrent=True, timeout_ctrl=5)
    with flow:
        pids = set()
        for _ in range(10):
            pids.update(replica_pids(flow.port))
        assert len(pids) == 2
        victim = sorted(pids)[0]
        outcomes, lock, waiting_since = [], threading.Lock(), {}

        def client(i):
            c = Client(host='127.0.0.1', port=flow.port)
            for n in range(15):
                docs = _docs(i, n)
                started = waiting_since[i] = time.monotonic()
                try:
                    out = c.post('/', docs)
                    _check(docs, out)  # an answer the client sees as success must be complete and right
                    result = 'ok'
                except AssertionError:
                    result = 'WRONG'
                except Exception:
                    result = 'error'  # seen by the client as failed: allowed
                with lock:
                    outcomes.append((result, started, time.monotonic()))
                    waiting_since[i] = None

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        wait_until(lambda: outcomes, 'load is flowing through both replicas', every=0.05)
        deadline = time.monotonic() + 60
        os.kill(victim, signal.SIGSTOP)
        stuck = 0.0
        while stuck < 3.0 and time.monotonic() < deadline:  # the live replica answers in well under 1 s
            time.sleep(0.1)
            now = time.monotonic()
            stuck = max([now - t for t in list(waiting_since.values()) if t is not None], default=0.0)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        assert stuck >= 3.0, 'no request waited on the frozen replica'
        [t.join() for t in threads]
        results = [r for r, _, _ in outcomes]
        assert 'WRONG' not in results
        assert len(results) == 60 and results.count('ok') > 0
        assert any(start < killed_at < end for _, start, end in outcomes), 'no client was waiting at the kill'
        # and the Flow keeps serving on the surviving replica
        out = Client(host='127.0.0.1', port=flow.port).post('/', DocumentArray([Document(text='after the crash')]))
        assert out[0].embedding is not None
        print(
            f'\nreplica kill: a request waited {stuck:.1f}s on the frozen replica; '
            f'{results.count("ok")} ok, {results.count("error")} failed visibly, 0 wrong'
        )


def _threads(pid):
    with open(f'/proc/{pid}/status') as f:
        return next(int(line.split()[1]) for line in f if line.startswith('Threads'))


def _in_flight(port):
    return _info(port)['requests_in_flight']


def test_clients_disconnecting_mid_request_leak_no_work(tmp_path):
    """Clients killed while their requests stream: the replica drains, its threads stay flat, it keeps serving."""
    import subprocess
    import sys

    flow = Flow().add(uses=CLIPEncoder, uses_with={'name': TINY}, allow_concurrent=True)
    with flow:
        [pid] = replica_pids(flow.port)
        script = (
            'from docarray import Document, DocumentArray; from jina import Client; '
            f'Client(host="127.0.0.1", port={flow.port}).post("/", '
            'DocumentArray([Document(text="long running " + str(i)) for i in range(20000)]), request_size=200)'
        )

        # each kill comes when the replica holds all it admits, so every round drives its request threads
        # to the same peak: the first round fills the bounded pools, and any later growth is a leak
        held = int(_info(flow.port)['limits']['max_requests'])

        def disconnect_rounds(rounds):
            for _ in range(rounds):
                client = subprocess.Popen(
                    [sys.executable, '-c', script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                wait_until(lambda: _in_flight(flow.port) >= held, 'the replica holds all it admits', 120, every=0.1)
                client.kill()
                client.wait()
            wait_until(lambda: _in_flight(flow.port) <= 1, 'the work of disconnected clients is gone', every=0.25)

        disconnect_rounds(1)  # fills the bounded thread pools
        baseline = _threads(pid)
        disconnect_rounds(3)
        assert _threads(pid) <= baseline + 2, f'threads grew from {baseline} to {_threads(pid)}'
        out = Client(host='127.0.0.1', port=flow.port).post('/', _docs(1, 1))
        _check(_docs(1, 1), out)
