"""The container tests' one expensive fixture: a Docker engine, the registry-free base images and the
image builds, made once for this package's tests (in two lanes: bookworm's base and its two images, trixie's base
and its image), plus the tiny model's ONNX export that the images serve. Every step is timed; the times
and the image sizes are printed at the end of the run.

Docker that cannot run at all here (no root, no apt-get) skips these tests with the reason; under CI=true
a Docker that is installed but does not work fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from .engine import (
    BASES,
    IMAGES,
    IN_CI,
    ROOT,
    BaseImageMissing,
    Docker,
    DockerUnavailable,
    Timings,
    build,
    engine,
    ensure_base,
)

TINY = 'clipserve-tiny::random'
TIMINGS = Timings()
SUMMARY: list[str] = []  # lines for the end of the run: sizes, the compose test's counts, the drain


@dataclass
class Containers:
    docker: Docker
    model_dir: Path  # the tiny model's ONNX export, readable by the images' uid 10001
    log_dir: Path

    def run(self, name: str, *args, **kwargs):
        """docker run -d --network host --name NAME ...: removed at the end of the session if still there."""
        return self.docker('run', '-d', '--network', 'host', '--name', name, *args, **kwargs).stdout.strip()


def pytest_configure(config):
    config.addinivalue_line('markers', 'docker: builds and runs container images (tests/containers)')


def pytest_collection_modifyitems(items):
    for item in items:
        if '/containers/' in str(item.fspath):
            item.add_marker(pytest.mark.docker)


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS.steps and not SUMMARY:
        return
    write = terminalreporter.write_line
    terminalreporter.section('containers')
    for name, seconds, note in TIMINGS.steps:
        write(f'{seconds:7.1f} s  {name}' + (f'  ({note})' if note else ''))
    for line in SUMMARY:
        write(line)


def _export(model_dir: Path) -> str:
    result = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'export', 'onnx', TINY, str(model_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, 'JINA_OPTOUT_TELEMETRY': '1'},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for path in [model_dir, *model_dir.iterdir()]:  # the images run as uid 10001
        path.chmod(0o755 if path.is_dir() else 0o644)
    return TINY


def _lane(docker: Docker, suite: str, names: list[str], log_dir: Path) -> None:
    TIMINGS.timed(f'base image {BASES[suite]}', ensure_base, docker, suite)
    for name in names:
        TIMINGS.timed(f'docker build {IMAGES[name].tag}', build, docker, IMAGES[name], log_dir)


def _sizes(docker: Docker) -> list[str]:
    def mb(tag):
        return int(docker('image', 'inspect', '--format', '{{.Size}}', tag).stdout) / 1e6

    lines = ['image sizes (docker image inspect .Size):', f'  {"image":32} {"base":28} {"MB":>6}']
    for image in IMAGES.values():
        lines.append(f'  {image.tag:32} {image.base:28} {mb(image.tag):6.0f}')
    for base in BASES.values():
        lines.append(f'  {base:32} {"(debootstrap minbase)":28} {mb(base):6.0f}')
    return lines


def _remove_our_containers(docker: Docker, own_daemon: bool) -> None:
    listed = docker('ps', '-a', '--format', '{{.ID}} {{.Names}}', check=False).stdout.split('\n')
    ours = [line.split()[0] for line in listed if line and (own_daemon or line.split()[1].startswith('clipserve-test'))]
    if ours:
        docker('rm', '-f', *ours, check=False, timeout=120)


@pytest.fixture(scope='package')  # torn down (dockerd stopped) when the last container test has run
def containers(tmp_path_factory):
    started = time.monotonic()
    try:
        docker, daemon, how = engine()
    except DockerUnavailable as error:
        if error.broken and IN_CI:
            pytest.fail(f'CI=true and Docker is installable but broken: {error}')
        pytest.skip(str(error))
    TIMINGS.add('docker engine', time.monotonic() - started, how)
    log_dir = tmp_path_factory.mktemp('container-logs')
    model_dir = tmp_path_factory.mktemp('model') / 'tiny-onnx'
    try:
        lanes = {'bookworm': ['cpu-onnx', 'cpu-openvino'], 'trixie': ['cpu-onnx-py3.13']}
        with ThreadPoolExecutor(len(lanes) + 1) as pool:
            futures = [pool.submit(_lane, docker, suite, names, log_dir) for suite, names in lanes.items()]
            futures.append(pool.submit(TIMINGS.timed, 'ONNX export of the tiny model (host venv)', _export, model_dir))
            for future in futures:
                future.result()
        TIMINGS.add('images ready (engine, bases, builds, export)', time.monotonic() - started)
        SUMMARY.extend(_sizes(docker))
        yield Containers(docker, model_dir, log_dir)
    except BaseImageMissing as error:
        pytest.fail(str(error))
    finally:
        _remove_our_containers(docker, own_daemon=daemon is not None)
        docker(
            'image', 'prune', '-f', check=False, timeout=300
        )  # superseded layers (the cache is tagged: engine.build)
        if daemon is not None:
            daemon.stop()
        TIMINGS.add('container tests, from the engine start to its stop', time.monotonic() - started)


@pytest.fixture(scope='package')
def docker(containers) -> Docker:
    return containers.docker


@pytest.fixture(scope='package')
def references(containers, tmp_path_factory) -> dict:
    """clip-client's embeddings (clients.TEXTS then IMAGES) from each shipped Flow the images serve, run from
    this checkout on the same export: {'onnx.yml': array, 'openvino.yml': array}."""
    from ..integration.conftest import flow_from_yaml, free_port, set_port
    from .clients import clip_client_embeddings

    out = {}
    for name in sorted({i.flow for i in IMAGES.values()}):
        port = free_port()
        env = {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_MODEL_PATH': str(containers.model_dir)}
        flow = flow_from_yaml(name, tmp_path_factory.mktemp('source-flows'), lambda c: set_port(c, port), env)
        with flow:
            out[name] = clip_client_embeddings(port)
    return out


def wait_healthy(docker: Docker, container: str, seconds: float = 300) -> None:
    """Until Docker's health check says healthy; a container that exits or turns unhealthy fails at once."""
    deadline = time.monotonic() + seconds
    while True:
        state = docker('inspect', '--format', '{{.State.Status}} {{.State.Health.Status}}', container).stdout.split()
        if state == ['running', 'healthy']:
            return
        if state[0] != 'running' or state[1] == 'unhealthy' or time.monotonic() > deadline:
            logs = docker('logs', '--tail', '60', container, check=False)
            raise AssertionError(f'{container} is {state}, not healthy:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}')
        time.sleep(0.5)


__all__ = ['Containers', 'ROOT', 'SUMMARY', 'TIMINGS', 'TINY', 'wait_healthy']
