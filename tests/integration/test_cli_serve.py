"""`clipserve serve --model ... --port ...`: the installed command builds and serves a Flow, answering
/v1/embeddings on the HTTP port and the unchanged clip-client on gRPC, as a user runs it: the command's folder on
PATH (an activated environment, the images), which is where Jina would find the command if a Flow named
`py_modules: [clipserve]`. `--host 127.0.0.1` keeps every socket on loopback; a token is asked of every call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from devkit.procfs import descendants, listening

from .conftest import TINY, free_port, stop_process, wait_for

BIN = Path(sys.executable).parent


def start(tmp_path, *flags, env=None) -> tuple[subprocess.Popen, int, int]:
    http, grpc_port = free_port(), free_port()
    command = [str(BIN / 'clipserve'), 'serve', '--model', TINY, '--port', str(http), '--grpc-port', str(grpc_port)]
    environ = {**os.environ, 'PATH': f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}', **(env or {})}
    environ.pop('CLIPSERVE_AUTH_TOKEN', None)
    environ.pop('JINA_MP_START_METHOD', None)  # the tests' setting (tests/conftest.py), not a user's
    environ['JINA_LOG_LEVEL'] = 'INFO'  # Jina's default, which the tests lower
    log = open(tmp_path / 'serve.log', 'a')
    process = subprocess.Popen(
        [*command, *flags], cwd=tmp_path, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / 'serve.log').read_text()[-3000:]
        try:
            return requests.get(f'http://127.0.0.1:{http}/readyz', timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(ready, 240, 'clipserve serve to be ready')
    except BaseException:
        stop_process(process)
        raise
    return process, http, grpc_port


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp('cli-serve')
    process, http, grpc_port = start(folder, '--host', '127.0.0.1')
    try:
        yield {'process': process, 'http': http, 'grpc': grpc_port, 'folder': folder}
    finally:
        stop_process(process)


def test_http_and_grpc_answer_the_same_vectors(served):
    from clip_client import Client

    answer = requests.post(
        f'http://127.0.0.1:{served["http"]}/v1/embeddings', json={'input': ['a dog', 'a cat']}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    over_http = np.array([d['embedding'] for d in answer.json()['data']], dtype=np.float32)
    over_grpc = Client(f'grpc://127.0.0.1:{served["grpc"]}').encode(['a dog', 'a cat'])
    assert over_http.shape == (2, 64)
    unit = over_grpc / np.linalg.norm(over_grpc, axis=1, keepdims=True)  # /v1/embeddings answers unit vectors
    np.testing.assert_allclose(unit, over_http, atol=1e-5)


def test_host_keeps_every_socket_on_loopback(served):
    sockets = listening({served['process'].pid, *descendants(served['process'].pid)})
    assert {served['http'], served['grpc']} <= {port for _, port, _ in sockets}
    beyond = [(str(a), port) for a, port, _ in sockets if not (getattr(a, 'ipv4_mapped', None) or a).is_loopback]
    assert not beyond, beyond


def test_ready_says_so_for_the_grpc_port(served):
    done = subprocess.run(
        [str(BIN / 'clipserve'), 'ready', f'127.0.0.1:{served["grpc"]}'], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and 'ready (SERVING)' in done.stdout


def test_a_token_is_asked_of_every_call(tmp_path):
    process, http, _ = start(tmp_path, '--host', '127.0.0.1', '--token', 'cli-token')
    try:
        url = f'http://127.0.0.1:{http}/v1/embeddings'
        assert requests.post(url, json={'input': 'a'}, timeout=60).status_code == 401
        with_token = {'Authorization': 'Bearer cli-token'}
        assert requests.post(url, json={'input': 'a'}, headers=with_token, timeout=60).status_code == 200
    finally:
        stop_process(process)


def test_the_start_is_quiet_and_says_where_it_listens(served):
    """No third-party warnings (pkg_resources, Jina's `docs` annotation, open_clip's root-logger line), no OPEN
    warning on loopback, and one ready line with the addresses and the token's state."""
    log = (served['folder'] / 'serve.log').read_text()
    for noise in ('pkg_resources', '`docs` annotation', 'WARNING:root', 'OPEN:'):
        assert noise not in log, noise
    ready = ' '.join(log[log.index('Flow ready:') :].split())[:400]
    assert f'gRPC 127.0.0.1:{served["grpc"]}' in ready and f'HTTP 127.0.0.1:{served["http"]}' in ready
    assert 'no token' in ready
