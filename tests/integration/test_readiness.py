"""Ready means ready: the Flow's readiness signal says yes only when every shard and replica serves,
and a replica told to stop (SIGTERM) finishes the requests it holds while the Flow says not ready.

The Flows run as operators run them (`jina flow --uses FILE` in its own process group), with one copy
held in its constructor (tests/integration/helpers/held_encoder.py) so that it is provably still
loading while the other copies serve.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from docarray import Document, DocumentArray
from jina import Client

from devkit.load import replica_pids

from .conftest import ROOT, TINY, free_port, health, make_image, stop_process, wait_for

HELD = Path(__file__).parent / 'helpers' / 'held_encoder.py'
BIN = Path(sys.executable).parent


def http_get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f'http://127.0.0.1:{port}{path}', timeout=3) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def held_flow(flow_name: str, tmp_path: Path, ports: list[int], protocols: list[str] | None = None) -> Path:
    """A shipped Flow with its encoder swapped for HeldCLIPEncoder at the tiny model."""
    config = yaml.safe_load((ROOT / 'flows' / flow_name).read_text())
    config['gateway']['port'] = ports if protocols else ports[0]
    if protocols:
        config['gateway']['protocol'] = protocols
    [executor] = config['executors']
    executor['uses'] = {
        'jtype': 'HeldCLIPEncoder',
        'py_modules': ['clipserve.serving', str(HELD)],
        'with': {'name': TINY, 'hold_dir': str(tmp_path)},
    }
    path = tmp_path / flow_name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start(flow_file: Path, tmp_path: Path) -> subprocess.Popen:
    log = open(tmp_path / 'flow.log', 'w')
    env = {**os.environ, 'JINA_OPTOUT_TELEMETRY': '1', 'JINA_LOG_LEVEL': 'INFO'}
    return subprocess.Popen(
        [BIN / 'jina', 'flow', '--uses', str(flow_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        cwd=tmp_path,
    )


def encode_one(port: int) -> bool:
    try:
        out = Client(host='127.0.0.1', port=port).post('/', DocumentArray([Document(text='up?')]), timeout=5000)
        return out[0].embedding is not None
    except Exception:
        return False


@pytest.mark.parametrize(
    'flow_name, held_copy',
    [
        ('shards.yml', 'clip_t_shard-1_rep-0'),
        ('replicas.yml', 'clip_t_rep-1'),
    ],
)
def test_not_ready_while_one_copy_loads_then_ready(flow_name, held_copy, tmp_path):
    grpc_port, http_port = free_port(), free_port()
    hold = tmp_path / f'{held_copy}.hold'
    hold.touch()
    process = start(held_flow(flow_name, tmp_path, [grpc_port, http_port], ['grpc', 'http']), tmp_path)
    try:
        # the held copy is provably in its constructor, and the Flow already answers requests (the
        # other copy serves them): what Jina's own checks take for ready
        wait_for(lambda: (tmp_path / f'{held_copy}.holding').exists(), 120, 'the held copy to start loading')
        wait_for(lambda: encode_one(grpc_port), 120, 'the other copy to serve')
        assert health(grpc_port, '') == 'SERVING'  # liveness: the gateway answers
        assert http_get(http_port, '/livez') == 200
        for _ in range(6):  # several probe rounds (the gateway probes every second)
            assert health(grpc_port) == 'NOT_SERVING'
            assert http_get(http_port, '/readyz') == 503
            time.sleep(0.5)
        not_ready = subprocess.run(
            [sys.executable, '-m', 'clipserve', 'ready', f'127.0.0.1:{grpc_port}'],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert not_ready.returncode == 1 and 'not ready' in not_ready.stdout
        hold.unlink()
        wait_for(lambda: health(grpc_port) == 'SERVING', 120, 'readiness after the held copy loaded')
        assert http_get(http_port, '/readyz') == 200
        ready = subprocess.run(
            [sys.executable, '-m', 'clipserve', 'ready', f'127.0.0.1:{grpc_port}'],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ready.returncode == 0, ready.stdout + ready.stderr
        # and at that point every copy serves
        if flow_name == 'replicas.yml':
            pids = set()
            for _ in range(20):
                pids.update(replica_pids(grpc_port))
            assert len(pids) == 2
        else:
            answers = (
                Client(host='127.0.0.1', port=grpc_port)
                .post('/clipserve/ready', DocumentArray([Document()]), return_responses=True)[0]
                .docs
            )
            assert sorted(d.tags['shard_id'] for d in answers) == [0, 1]
        log = (tmp_path / 'flow.log').read_text()
        assert 'warm-up' in log  # the ready line shows the warm-up's cost
    finally:
        hold.unlink(missing_ok=True)
        stop_process(process)


def test_sigterm_drains_requests_in_flight_and_the_flow_says_not_ready(tmp_path):
    """A replica of replicas.yml gets SIGTERM while a request is provably inside it (held in the encoder
    by the test): the Flow says not ready while it drains, the held request is answered in full, every
    other request is answered or fails with a clear error, and the replica exits after."""
    port = free_port()
    process = start(held_flow('replicas.yml', tmp_path, [port]), tmp_path)
    try:
        wait_for(lambda: health(port) == 'SERVING', 180, 'the Flow to be ready')
        (tmp_path / 'encode.hold').touch()
        results, lock = {}, threading.Lock()

        def client(i):
            docs = DocumentArray(
                [Document(id=f'{i}-{k}', text=f'text {k}') for k in range(50)]
                + [Document(id=f'{i}-img', blob=make_image(seed=i))]
            )
            try:
                out = Client(host='127.0.0.1', port=port).post('/', docs, request_size=100, timeout=120_000)
                ok = len(out) == 51 and all(d.embedding is not None and d.embedding.shape == (64,) for d in out)
                result = 'answered' if ok else 'WRONG'
            except Exception as error:  # a clear failure the caller sees is allowed; a silent loss is not
                result = f'failed: {error}'
            with lock:
                results[i] = result

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        wait_for(lambda: list(tmp_path.glob('encode.started.*')), 60, 'a request inside a replica')
        marker = sorted(tmp_path.glob('encode.started.*'))[0]
        victim, inside = int(marker.suffix[1:]), int(marker.read_text().split('-')[0])
        os.kill(victim, signal.SIGTERM)
        # the request is still held inside the victim: the Flow must say not ready now
        wait_for(lambda: health(port) == 'NOT_SERVING', 30, 'not ready while draining')
        assert inside not in results and _alive(victim), 'the held request finished before the check'
        (tmp_path / 'encode.hold').unlink()
        [t.join(120) for t in threads]
        assert sorted(results) == [0, 1, 2, 3], results  # every request has an outcome the caller saw
        assert results[inside] == 'answered', results  # the one inside the draining replica was finished
        for outcome in results.values():
            assert outcome == 'answered' or 'UNAVAILABLE' in outcome, results  # nothing wrong, nothing vague
        wait_for(lambda: not _alive(victim), 60, 'the replica to exit after its requests')
        assert health(port) == 'NOT_SERVING'  # one of the two replicas is gone: not every copy serves
        assert 'draining' in (tmp_path / 'flow.log').read_text()  # the replica said what it did
    finally:
        (tmp_path / 'encode.hold').unlink(missing_ok=True)
        stop_process(process)


def _alive(pid: int) -> bool:
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False
