"""Each image CI builds (cpu-onnx and cpu-openvino on Python 3.11, cpu-onnx on Python 3.13), as an operator
runs it: its metadata and contents (non-root, no torch, no compilers or build caches, exactly the versions
of its lock, locks/VARIANT.txt), then started with host networking: healthy by its own HEALTHCHECK command,
serving clip-client and the openai SDK the embeddings a Flow run from source gives, and stopped with `docker stop`.

The container serves the image's own Flow (flows/onnx.yml or flows/openvino.yml) with two changes, in a
copy mounted into it: free ports with HTTP next to gRPC (the OpenAI routes), and the encoder swapped
for tests/integration/helpers/held_encoder.py's subclass, so the stop test can hold a request inside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ..integration.conftest import free_port, health, wait_for
from ..lockfiles import canonical, linux_environment, pins, resolve
from .clients import MIN_COSINE, TEXTS, TINY, clip_client_embeddings, cosines, executor_info, openai_embeddings
from .conftest import ROOT, SUMMARY, TIMINGS, wait_healthy
from .contents import image_facts
from .engine import BUILT_WITH, IMAGES, BaseImageMissing, build, project_version

HELD = ROOT / 'tests' / 'integration' / 'helpers' / 'held_encoder.py'
HEALTHCHECK = ['CMD', 'python', '-m', 'clipserve', 'ready', '127.0.0.1:51000', '--timeout', '10']
# The precision the Flows from source choose: tests/conftest.py turns off the CPU's bf16 detection, which
# would otherwise serve bf16 images on CPUs with AVX512-BF16/AMX (cosine ~0.99996 to fp32).
SAME_PRECISION = f'CLIPSERVE_CPU_BF16={os.environ.get("CLIPSERVE_CPU_BF16", "0")}'


def container_logs(docker, name: str) -> str:
    result = docker('logs', name, check=False)
    return result.stdout + result.stderr


@pytest.fixture(scope='module', params=list(IMAGES))
def image(request, containers):
    return IMAGES[request.param]


@dataclass
class Served:
    name: str
    grpc: int
    http: int
    hold: Path | None


@contextlib.contextmanager
def serving(containers, image, folder: Path, held: bool = False):
    """The image serving a copy of its own Flow on free ports (gRPC + HTTP), checked by the image's HEALTHCHECK
    command on that port; `held`: the encoder is HeldCLIPEncoder, holding requests while <hold>/encode.hold exists."""
    folder.mkdir(mode=0o755)
    grpc_port, http_port = free_port(), free_port()
    config = yaml.safe_load((ROOT / 'flows' / image.flow).read_text())
    config['gateway'].update(protocol=['grpc', 'http'], port=[grpc_port, http_port])
    mounts = ['-v', f'{containers.model_dir}:/models/tiny:ro', '-v', f'{folder}:/srv/clipserve/test:ro']
    hold = None
    if held:
        hold = folder / 'hold'
        hold.mkdir()
        hold.chmod(0o777)  # the container's uid 10001 writes its markers here
        [executor] = config['executors']
        executor['uses'].update(
            jtype='HeldCLIPEncoder', py_modules=['clipserve.serving', '/srv/clipserve/held/held_encoder.py']
        )
        executor['uses']['with']['hold_dir'] = '/hold'
        mounts += ['-v', f'{HELD}:/srv/clipserve/held/held_encoder.py:ro', '-v', f'{hold}:/hold']
    (folder / 'flow.yml').write_text(yaml.safe_dump(config, sort_keys=False))
    (folder / 'flow.yml').chmod(0o644)
    name = f'clipserve-test-{folder.name}'
    probe = f'python -m clipserve ready 127.0.0.1:{grpc_port} --timeout 10'  # the image's HEALTHCHECK, this port
    started = time.monotonic()
    containers.run(
        name,
        *mounts,
        *('-e', f'CLIPSERVE_MODEL={TINY}', '-e', 'CLIPSERVE_MODEL_PATH=/models/tiny', '-e', SAME_PRECISION),
        *('--health-cmd', probe, '--health-interval', '2s', '--health-start-period', '300s'),  # 2 s, not 30 s
        *('--health-timeout', '20s', '--health-retries', '3'),
        image.tag,
        '/srv/clipserve/test/flow.yml',  # absolute: Jina cannot find the gateway's py_modules from a bare file name
    )
    try:
        wait_healthy(containers.docker, name)
        TIMINGS.add(
            f'{image.tag}: docker run to healthy' + (' (held encoder)' if held else ''), time.monotonic() - started
        )
        yield Served(name, grpc_port, http_port, hold)
    finally:
        containers.docker('rm', '-f', name, check=False)


@pytest.fixture(scope='module')
def served(image, containers, tmp_path_factory):
    with serving(containers, image, tmp_path_factory.mktemp('served') / image.tag.split(':')[1]) as served:
        yield served


def test_image_metadata_and_contents(image, docker):
    [inspected] = json.loads(docker('image', 'inspect', image.tag).stdout)
    config = inspected['Config']
    labels, env = config['Labels'], dict(item.split('=', 1) for item in config['Env'])
    expected = BUILT_WITH[image.tag]
    assert labels['org.opencontainers.image.version'] == project_version() == expected['VERSION']
    assert labels['org.opencontainers.image.licenses'] == 'Apache-2.0'
    assert re.fullmatch(r'[0-9a-f]{40}(-dirty)?', expected['REVISION']), expected
    assert labels['org.opencontainers.image.revision'] == expected['REVISION']
    assert labels['org.opencontainers.image.source'] == expected['SOURCE']
    assert config['User'] == '10001:10001'
    assert config['Entrypoint'] == ['python', '-m', 'clipserve'] and config['Cmd'] == [f'flows/{image.flow}']
    assert config['Healthcheck']['Test'] == HEALTHCHECK and config['StopSignal'] == 'SIGINT'
    assert env['CLIPSERVE_BACKEND'] == image.backend and env['JINA_OPTOUT_TELEMETRY'] == '1'

    facts = image_facts(docker, image.tag)
    assert facts['python'].startswith(image.python + '.'), facts['python']
    assert not facts['torch'], f'{image.tag} contains torch'
    assert {tool: path for tool, path in facts['tools'].items() if path} == {}, 'build tools left in the image'
    folders = facts['folders']
    assert folders['/root/.cache'] is None and folders['/home/clipserve/.cache'] is None, folders  # no pip cache
    assert folders['/src'] is None and folders['/tmp'] == [], folders  # no build folder, nothing left in /tmp
    assert not [f for f in folders['/var/cache/apt/archives'] or [] if f.endswith('.deb')], folders
    assert [f for f in folders['/var/lib/apt/lists'] or [] if f not in ('lock', 'partial', 'auxfiles')] == []
    installed = {canonical(name): version for name, version in facts['distributions'].items()}
    assert installed['clipserve'] == project_version()
    # exactly the lock's versions for the image's Python (the lock as it was when the image was built), and
    # nothing else but clipserve and the venv's own pip: built twice, an image holds the same distributions
    locked = resolve(expected['lock'], linux_environment(facts['python']))
    wrong = {n: (installed.get(n), v) for n, v in locked.items() if installed.get(n) != v}
    assert wrong == {}, f'(installed, locks/{image.variant}.txt): {wrong}'
    unlocked = sorted(set(installed) - set(locked) - {'clipserve', 'pip'})
    assert unlocked == [], f'distributions locks/{image.variant}.txt does not pin: {unlocked}'
    pinned = pins(expected['constraints.txt'])
    SUMMARY.append(
        f'{image.tag}: Python {facts["python"]}, venv {facts["venv_bytes"] / 1e6:.0f} MB, {len(installed)} '
        f'distributions, all at locks/{image.variant}.txt versions ({len(set(installed) & set(pinned))} of them '
        f'constraints.txt pins)'
    )


def test_serves_clip_client_and_openai_sdk_like_a_flow_from_source(image, served, references, docker):
    want = references[image.flow]
    by_clip_client = cosines(clip_client_embeddings(served.grpc), want)
    by_openai = cosines(openai_embeddings(served.http), want)
    assert by_clip_client.min() >= MIN_COSINE, by_clip_client
    assert by_openai.min() >= MIN_COSINE, by_openai
    [info] = executor_info(served.grpc).values()
    assert info['backend'] == image.backend and not info['torch_imported'], info
    # every process of the container (the Flow, its gateway and executor) runs as uid 10001
    rows = docker('top', served.name, '-eo', 'pid,uid').stdout.splitlines()[1:]
    uids = [row.split()[1] for row in rows]
    assert uids and set(uids) == {'10001'}, uids
    SUMMARY.append(
        f'{image.tag}: healthy; clip-client cosine min {by_clip_client.min():.7f}, openai SDK cosine min '
        f'{by_openai.min():.7f} (vs flows/{image.flow} from source); {len(uids)} processes, all uid 10001'
    )


def test_docker_stop_lets_the_request_in_flight_finish_and_exits_0(image, containers, references, tmp_path):
    """`docker stop` (SIGINT) while a request is provably inside the executor: the container exits 0, the
    executor drains (says so, refuses new requests), and the request held inside is answered in full."""
    docker = containers.docker
    with serving(containers, image, tmp_path / f'held-{image.tag.split(":")[1]}', held=True) as served:
        _stop_while_a_request_is_held(image, served, docker, references)


def _stop_while_a_request_is_held(image, served, docker, references):
    hold = served.hold / 'encode.hold'
    hold.touch()
    outcome = {}

    def held_request():
        from clip_client import Client

        try:
            outcome['embedding'] = Client(f'grpc://127.0.0.1:{served.grpc}').encode(TEXTS[:1])
        except Exception as error:  # what the caller sees
            outcome['error'] = f'{type(error).__name__}: {error}'

    thread = threading.Thread(target=held_request)
    thread.start()
    try:
        wait_for(lambda: list(served.hold.glob('encode.started.*')), 60, 'a request inside the executor')
        stopper = subprocess.Popen(['docker', 'stop', '-t', '60', served.name], env=docker.env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        wait_for(lambda: 'draining' in container_logs(docker, served.name), 60, 'the executor to say it drains')
        # the gateway learns it from its next probe of the executor (readiness_interval, 1 s): poll a while
        readiness_while_draining, until = health(served.grpc), time.monotonic() + 15
        while readiness_while_draining != 'NOT_SERVING' and time.monotonic() < until:
            time.sleep(0.25)
            readiness_while_draining = health(served.grpc)
    finally:
        hold.unlink(missing_ok=True)
    thread.join(120)
    assert stopper.wait(120) == 0, stopper.stdout.read()
    state = docker('inspect', '--format', '{{.State.Status}} {{.State.ExitCode}}', served.name).stdout.split()
    assert state == ['exited', '0'], state
    assert 'embedding' in outcome, outcome
    assert cosines(outcome['embedding'], references[image.flow][:1]).min() >= MIN_COSINE
    assert readiness_while_draining == 'NOT_SERVING', readiness_while_draining  # the gateway stays up meanwhile
    SUMMARY.append(f'{image.tag}: docker stop drained the request in flight and exited 0')


def test_a_missing_base_image_is_an_error_naming_the_recipe(containers, tmp_path):
    """No registry: the build stops before `docker build` could ask Docker Hub for the base, and says how to make it."""
    missing = dataclasses.replace(IMAGES['cpu-onnx'], tag='clipserve:never-built', base='local/python:not-made')
    with pytest.raises(BaseImageMissing, match=r'local/python:not-made.*deploy/make-base-image\.sh'):
        build(containers.docker, missing, tmp_path)
    assert not containers.docker.has_image('clipserve:never-built')
