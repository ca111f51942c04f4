"""Real Flows on loopback for the integration tests, plus image fixtures the tests make themselves."""

import base64
import io
import os
import random
import socket
import time
from collections import deque
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image

from ..conftest import TESTS_FIRST_PORT

TINY = 'clipserve-tiny::random'


_HANDED_OUT: deque[int] = deque(maxlen=(65535 - TESTS_FIRST_PORT) // 2)


def free_port() -> int:
    """A free port above the kernel's ephemeral range, so no connection's source port takes it before the
    server binds it, and above Jina's own ports, so no executor of a Flow starting meanwhile does
    (tests/conftest.py). Never one it handed out recently: a test asking for three ports before it binds
    any must get three different ones."""
    for _ in range(1000):
        port = random.randint(TESTS_FIRST_PORT, 65535)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
            except OSError:
                continue
        _HANDED_OUT.append(port)
        return port
    raise RuntimeError(f'no free port in {TESTS_FIRST_PORT}-65535')


def health(port: int, service: str = 'readiness') -> str:
    """The gateway's gRPC health answer for `service` ('readiness': every copy of every executor serves)."""
    with grpc.insecure_channel(f'127.0.0.1:{port}') as channel:
        try:
            ask = health_pb2.HealthCheckRequest(service=service)
            answer = health_pb2_grpc.HealthStub(channel).Check(ask, timeout=3)
        except grpc.RpcError as error:
            return error.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f'timed out after {seconds}s waiting for {what}')


def make_image(width=64, height=48, seed=0, fmt='PNG') -> bytes:
    """A smooth gradient plus noise, so resampling has real work to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def data_uri(data: bytes, mime='image/png') -> str:
    return f'data:{mime};base64,' + base64.b64encode(data).decode()


@pytest.fixture(scope='session')
def tiny_flow():
    """One gateway serving gRPC and WebSocket; small limits so the limit paths are cheap to hit."""
    from jina import Flow

    from clipserve import CLIPEncoder

    ports = {'grpc': free_port(), 'websocket': free_port(), 'http': free_port()}
    flow = Flow(protocol=list(ports), port=list(ports.values())).add(
        name='encoder',
        uses=CLIPEncoder,
        uses_with={
            'name': TINY,
            'minibatch_size': 4,
            'num_worker_preprocess': 2,
            'max_image_pixels': 4_000_000,
            'batch_wait_ms': 50,
        },
        allow_concurrent=True,
    )
    with flow:
        yield ports


ROOT = Path(__file__).resolve().parents[2]


def flow_from_yaml(name: str, directory: Path, edit=None, env=None):
    """A shipped Flow YAML loaded as is, except for what `edit(config)` changes (ports, model names).

    `env` is applied while Jina reads the file (that is when `${{ ENV.X }}` is substituted).
    """
    from jina import Flow

    config = yaml.safe_load((ROOT / 'flows' / name).read_text())
    if edit:
        edit(config)
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = env or {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Flow.load_config(str(path))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def set_port(config, port):
    section = config['gateway'] if 'gateway' in config else config['with']
    section['port'] = port
    return config


class FlowProcess:
    """A Flow YAML (a dict) served by `jina flow --uses FILE` in a process group of its own, as operators run
    it; `port` is its first gateway port. Use as a context manager: ready on entry, stopped on exit."""

    def __init__(self, config: dict, folder: Path, env: dict | None = None, ready_seconds: float = 240):
        import subprocess
        import sys

        self.config, self.folder, self.ready_seconds = config, Path(folder), ready_seconds
        self.folder.mkdir(parents=True, exist_ok=True)
        port = config.get('gateway', config.get('with', {})).get('port')
        self.port = port[0] if isinstance(port, list) else port
        path = self.folder / 'flow.yml'
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.folder / 'flow.log'
        environ = {**os.environ, 'NO_VERSION_CHECK': '1', 'COLUMNS': '1000', **(env or {})}
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / 'jina'), 'flow', '--uses', str(path)],
            cwd=self.folder,
            env=environ,
            stdout=open(self.log_path, 'a'),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors='replace')

    def wait_ready(self) -> 'FlowProcess':
        from jina import Client

        client = Client(host='127.0.0.1', port=self.port)

        def ready():
            assert self.process.poll() is None, self.log()[-4000:]
            return client.is_flow_ready(timeout=1)

        wait_for(ready, self.ready_seconds, f'the Flow in {self.folder} to be ready')
        return self

    def kill(self) -> None:
        """kill -9 of every process of the Flow (no shutdown of any kind)."""
        import signal

        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def __enter__(self) -> 'FlowProcess':
        try:
            return self.wait_ready()
        except BaseException:
            stop_process(self.process)
            raise

    def __exit__(self, *exc) -> None:
        stop_process(self.process)


def stop_process(process) -> None:
    """Stop a server started with start_new_session=True: SIGINT (a clean Jina shutdown), then SIGKILL."""
    import signal
    import subprocess

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
