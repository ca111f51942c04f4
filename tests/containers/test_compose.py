"""deploy/compose.yml run for real (host networking: a gateway, an encoder with two replicas, a ranker), driven
by clip-client while one encoder replica is killed with `docker kill` and started again.

To know that requests were inside the replica when it died, a test-only override makes encoder-1 run
HeldCLIPEncoder (tests/integration/helpers/held_encoder.py, a CLIPEncoder that holds requests while a file
exists): the kill comes while at least one request is provably held inside it. Everything else is the
shipped file. Each client retries a failed request (up to 3 attempts); the test counts failed attempts
(what a client without retries would have seen) and failures left after the retries (what users see).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
import yaml
from docarray import Document, DocumentArray

from ..integration.conftest import free_port, health, wait_for
from .clients import TEXTS, TINY, clip_client_embeddings, cosines, openai_embeddings
from .conftest import ROOT, SUMMARY, TIMINGS, wait_healthy

CLIENTS = 4
ATTEMPTS = 3


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: Counter = field(default_factory=Counter)  # client -> requests finished (answered or given up)
    in_flight: set = field(default_factory=set)
    failed_attempts: list = field(default_factory=list)  # (request, attempt, error)
    user_failures: list = field(default_factory=list)  # requests that failed every attempt
    wrong: list = field(default_factory=list)  # answers of the wrong shape

    def least_done(self) -> int:
        with self.lock:
            return min(self.done[i] for i in range(CLIENTS))


def client_loop(port: int, i: int, stop: threading.Event, tally: Tally) -> None:
    from clip_client import Client

    client = Client(f'grpc://127.0.0.1:{port}')
    n = 0
    while not stop.is_set():
        key = (i, n)
        with tally.lock:
            tally.in_flight.add(key)
        answered = False
        for attempt in range(1, ATTEMPTS + 1):
            try:
                out = client.encode([f'client {i} request {n} text {k}' for k in range(4)])
                answered = True
                if out.shape != (4, 64) or not np.isfinite(out).all():
                    with tally.lock:
                        tally.wrong.append((key, out.shape))
                break
            except Exception as error:  # counted; retried after a short backoff
                with tally.lock:
                    tally.failed_attempts.append((key, attempt, f'{type(error).__name__}: {error}'[:300]))
                time.sleep(0.5 * attempt)
        with tally.lock:
            tally.in_flight.discard(key)
            tally.done[i] += 1
            if not answered:
                tally.user_failures.append(key)
        n += 1


def retryable(error: str) -> bool:
    """A clear error a client can retry: gRPC's UNAVAILABLE (the gateway or a replica could not be reached)."""
    return 'UNAVAILABLE' in error


@pytest.fixture
def deployment(containers, tmp_path):
    """deploy/compose.yml up (with the held encoder-1 override) on free ports; down -v at the end."""
    docker = containers.docker
    ports = {
        name: free_port()
        for name in ('PORT', 'HTTP_PORT', 'ENCODER_0_PORT', 'ENCODER_1_PORT', 'RANKER_PORT')
    }  # fmt: skip
    env = {
        **docker.env,
        **{f'CLIPSERVE_{name}': str(port) for name, port in ports.items()},
        'CLIPSERVE_IMAGE': 'clipserve:cpu-onnx',
        'CLIPSERVE_MODEL_DIR': str(containers.model_dir),
        'CLIPSERVE_MODEL': TINY,
        'OMP_NUM_THREADS': '1',
    }
    tmp_path.chmod(0o755)
    hold = tmp_path / 'hold'
    hold.mkdir()
    hold.chmod(0o777)  # the containers' uid 10001 writes the markers
    held_config = yaml.safe_load((ROOT / 'executors' / 'hub' / 'CLIPEncoder' / 'config.yml').read_text())
    held_config.update(jtype='HeldCLIPEncoder', py_modules=['clipserve.serving', '/srv/clipserve/held/held_encoder.py'])
    held_config['with']['hold_dir'] = '/hold'
    (tmp_path / 'held-config.yml').write_text(yaml.safe_dump(held_config, sort_keys=False))
    command = yaml.safe_load((ROOT / 'deploy' / 'compose.yml').read_text())['services']['encoder-1']['command']
    command[command.index('--uses') + 1] = '/srv/clipserve/held/config.yml'
    override = {
        'services': {
            'encoder-1': {
                'command': command,
                'volumes': [
                    f'{ROOT / "tests" / "integration" / "helpers" / "held_encoder.py"}:/srv/clipserve/held/held_encoder.py:ro',
                    f'{tmp_path / "held-config.yml"}:/srv/clipserve/held/config.yml:ro',
                    f'{hold}:/hold',
                ],
            }
        }
    }
    (tmp_path / 'held.yml').write_text(yaml.safe_dump(override, sort_keys=False))
    project = f'clipserve-test-{tmp_path.name.lower()}'.replace('_', '-')
    base = [*docker.compose(), '-f', str(ROOT / 'deploy' / 'compose.yml'), '-f', str(tmp_path / 'held.yml')]
    base += ['-p', project]

    def compose(*args, timeout=300):
        return subprocess.run([*base, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    started = time.monotonic()
    up = compose('up', '-d')
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        services = {s: compose('ps', '-q', s).stdout.strip() for s in ('gateway', 'encoder-0', 'encoder-1', 'ranker')}
        for container in services.values():
            wait_healthy(docker, container)
        wait_for(lambda: health(ports['PORT']) == 'SERVING', 120, 'the gateway to say every replica serves')
        TIMINGS.add('compose up to every service healthy', time.monotonic() - started)
        yield {'ports': ports, 'services': services, 'hold': hold, 'compose': compose}
    finally:
        compose('down', '-v', '--timeout', '60')


def test_compose_deployment_survives_a_killed_encoder_replica(deployment, docker):
    ports, services, hold = deployment['ports'], deployment['services'], deployment['hold']
    grpc = ports['PORT']
    # the deployment answers: clip-client's /encode and /rank (encoder, then ranker) and the openai SDK
    assert cosines(openai_embeddings(ports['HTTP_PORT']), clip_client_embeddings(grpc)).min() >= 0.99999
    from clip_client import Client

    query = Document(text=TEXTS[0], matches=[Document(text=TEXTS[1]), Document(text=TEXTS[0])])
    ranked = Client(f'grpc://127.0.0.1:{grpc}').rank(DocumentArray([query]))[0].matches
    assert ranked[0].text == TEXTS[0] and ranked[0].scores['clip_score'].value > ranked[1].scores['clip_score'].value

    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=client_loop, args=(grpc, i, stop, tally)) for i in range(CLIENTS)]
    [thread.start() for thread in threads]
    try:
        wait_for(lambda: tally.least_done() >= 5, 120, 'every client to be answered 5 times')
        (hold / 'encode.hold').touch()  # from now on encoder-1 holds what it gets
        wait_for(lambda: list(hold.glob('encode.started.*')), 60, 'a request held inside encoder-1')
        with tally.lock:
            in_flight_at_kill = len(tally.in_flight)
            done_at_kill = sum(tally.done.values())
        docker('kill', services['encoder-1'])
        killed_at = time.monotonic()
        (hold / 'encode.hold').unlink()  # the replica started again must not hold
        mark = tally.least_done()
        wait_for(lambda: tally.least_done() >= mark + 10, 180, '10 more answers per client with encoder-1 dead')
        assert docker('inspect', '--format', '{{.State.Status}}', services['encoder-1']).stdout.strip() == 'exited'
        docker('start', services['encoder-1'])
        wait_healthy(docker, services['encoder-1'])
        wait_for(lambda: health(grpc) == 'SERVING', 120, 'the gateway to see encoder-1 serve again')
        back_after = time.monotonic() - killed_at
        mark = tally.least_done()
        wait_for(lambda: tally.least_done() >= mark + 10, 180, '10 more answers per client with encoder-1 back')
    finally:
        stop.set()
        [thread.join(120) for thread in threads]
    # the restarted replica serves by itself too
    from jina import Client as JinaClient

    direct = JinaClient(host='127.0.0.1', port=ports['ENCODER_1_PORT']).post('/', DocumentArray([Document(text='hi')]))
    assert direct[0].embedding.shape == (64,)

    sent = sum(tally.done.values())
    kinds = Counter(
        error.split(':')[0] + (' UNAVAILABLE' if retryable(error) else '') for _, _, error in tally.failed_attempts
    )
    SUMMARY.append(
        f'compose: {sent} requests from {CLIENTS} clip-client loops ({done_at_kill} before the kill); encoder-1 '
        f'killed with {in_flight_at_kill} requests in flight (>= 1 held inside it), serving again after '
        f'{back_after:.1f} s; failed attempts {len(tally.failed_attempts)} {dict(kinds)}; failures after the '
        f'client retry {len(tally.user_failures)}; wrong answers {len(tally.wrong)}'
    )
    assert tally.wrong == []
    assert tally.user_failures == [], tally.failed_attempts
    assert len(tally.failed_attempts) <= in_flight_at_kill, tally.failed_attempts  # none beyond those in flight
    assert all(retryable(error) for _, _, error in tally.failed_attempts), tally.failed_attempts

    # stopped cleanly: every service exits 0 on its stop signal (SIGINT), then down removes everything
    stopped = deployment['compose']('stop', '--timeout', '60')
    assert stopped.returncode == 0, stopped.stderr
    codes = {s: docker('inspect', '--format', '{{.State.ExitCode}}', c).stdout.strip() for s, c in services.items()}
    down = deployment['compose']('down', '-v', '--timeout', '60')
    assert down.returncode == 0, down.stderr
    left = docker('ps', '-a', '-q', '--filter', f'id={services["gateway"]}').stdout.strip()
    SUMMARY.append(f'compose: stop exit codes {codes}; down rc {down.returncode}')
    assert left == '' and set(codes.values()) == {'0'}, codes
