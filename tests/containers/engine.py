"""A Docker engine for the container tests: found or started (dockerd --bridge=none, host networking only),
the registry-free base images (deploy/make-base-image.sh, debootstrap) and the image builds.

Nothing here pulls from a registry: a base image that is missing and cannot be made is an error naming
the recipe, before `docker build` could try Docker Hub.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get('CI', '').lower() in ('1', 'true', 'yes')
# dockerd's images and layers persist here between runs (the build cache); CLIPSERVE_DOCKER_DATA_ROOT moves it
DATA_ROOT = Path(os.environ.get('CLIPSERVE_DOCKER_DATA_ROOT', '/var/lib/clipserve-test-docker'))
APT_PACKAGES = ['docker.io', 'debootstrap', 'docker-compose']
RECIPE = 'deploy/make-base-image.sh SUITE TAG (debootstrap, no registry; docs/containers.md, "Base images")'


@dataclass(frozen=True)
class Image:
    tag: str
    variant: str  # the Dockerfile's VARIANT
    suite: str  # the Debian release of the base
    base: str  # PYTHON_IMAGE
    python: str  # major.minor in the image
    backend: str
    flow: str  # the shipped Flow the image serves by default


BASES = {'bookworm': 'local/python:3.11-bookworm', 'trixie': 'local/python:3.13-trixie'}
IMAGES = {
    'cpu-onnx': Image('clipserve:cpu-onnx', 'cpu-onnx', 'bookworm', BASES['bookworm'], '3.11', 'onnx', 'onnx.yml'),
    'cpu-openvino': Image(
        'clipserve:cpu-openvino', 'cpu-openvino', 'bookworm', BASES['bookworm'], '3.11', 'openvino', 'openvino.yml'
    ),
    'cpu-onnx-py3.13': Image(
        'clipserve:cpu-onnx-py3.13', 'cpu-onnx', 'trixie', BASES['trixie'], '3.13', 'onnx', 'onnx.yml'
    ),
}


class DockerUnavailable(Exception):
    """Docker cannot run here. `broken`: it is installed (or installable) but does not work."""

    def __init__(self, message: str, broken: bool):
        super().__init__(message)
        self.broken = broken


class BaseImageMissing(Exception):
    pass


class Timings:
    """Named steps and their seconds, printed at the end of the test session."""

    def __init__(self):
        self.steps: list[tuple[str, float, str]] = []

    def add(self, name: str, seconds: float, note: str = '') -> None:
        self.steps.append((name, seconds, note))
        print(f'[containers] {name}: {seconds:.1f} s {note}'.rstrip(), flush=True)

    def timed(self, name: str, function, *args, **kwargs):
        started = time.monotonic()
        result = function(*args, **kwargs)
        self.add(name, time.monotonic() - started, result if isinstance(result, str) else '')
        return result


class Docker:
    """The docker command bound to one daemon."""

    def __init__(self, host: str):
        self.host = host
        # BuildKit needs the buildx plugin with today's docker CLI; the classic builder needs nothing
        self.env = {**os.environ, 'DOCKER_HOST': host, 'DOCKER_BUILDKIT': '0'}

    def __call__(self, *args, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ['docker', *map(str, args)], env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f'docker {" ".join(map(str, args))[:300]} -> {result.returncode}: {result.stderr[-3000:]}'
            )
        return result

    def works(self) -> bool:
        try:
            return self('info', '--format', '{{.ServerVersion}}', timeout=20, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def has_image(self, tag: str) -> bool:
        return self('image', 'inspect', tag, check=False).returncode == 0

    def compose(self) -> list[str]:
        """`docker compose` (the v2 plugin) where present, else Debian's docker-compose (v1)."""
        if self('compose', 'version', check=False).returncode == 0:
            return ['docker', 'compose']
        if shutil.which('docker-compose'):
            return ['docker-compose']
        raise DockerUnavailable('neither `docker compose` nor docker-compose is installed', broken=True)


def _run(args, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def install_tools() -> str:
    """Debian's docker.io, debootstrap and docker-compose, when any is missing; '' when all are there."""
    missing = [tool for tool in ('docker', 'dockerd', 'debootstrap') if not shutil.which(tool)]
    if not shutil.which('docker-compose'):
        missing.append('docker-compose')
    if not missing:
        return ''
    if os.geteuid() != 0 or not shutil.which('apt-get'):
        raise DockerUnavailable(
            f'Docker cannot run here: {", ".join(missing)} missing, and installing them needs root and apt-get '
            f'({" ".join(APT_PACKAGES)})',
            broken=False,
        )
    command = ['apt-get', 'install', '-y', '-q', *APT_PACKAGES]
    result = _run(command, env={**os.environ, 'DEBIAN_FRONTEND': 'noninteractive'})
    if result.returncode != 0:  # stale package lists: update once and retry
        _run(['apt-get', 'update', '-q'])
        result = _run(command, env={**os.environ, 'DEBIAN_FRONTEND': 'noninteractive'})
    if result.returncode != 0:
        raise DockerUnavailable(f'apt-get install {" ".join(APT_PACKAGES)} failed: {result.stderr[-2000:]}', True)
    return f'installed {", ".join(missing)}'


class Daemon:
    """A dockerd of this test session: host networking only (--bridge=none, no iptables), its own socket,
    loopback as `host-gateway` (Jina's docker:// executors add host.docker.internal:host-gateway), and
    DATA_ROOT as the image store, locked so that two sessions on one machine take turns."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.run_dir = Path(tempfile.mkdtemp(prefix='csd-', dir='/tmp'))  # short: socket paths are limited
        self.host = f'unix://{self.run_dir}/docker.sock'
        self.log_path = self.run_dir / 'dockerd.log'
        self._lock = None

    def start(self, seconds: float = 90) -> Docker:
        if os.geteuid() != 0:
            raise DockerUnavailable('Docker cannot run here: starting dockerd needs root', broken=False)
        DATA_ROOT.mkdir(parents=True, exist_ok=True)
        self._lock = open(DATA_ROOT.with_name(DATA_ROOT.name + '.lock'), 'w')
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # another session's dockerd on the same store: wait for it
        args = [
            'dockerd',
            '--bridge=none',
            '--iptables=false',
            '--ip-forward=false',
            '--host-gateway-ip=127.0.0.1',
            f'--host={self.host}',
            f'--data-root={DATA_ROOT}',
            f'--exec-root={self.run_dir}/exec',
            f'--pidfile={self.run_dir}/docker.pid',
        ]
        log = open(self.log_path, 'w')
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        docker = Docker(self.host)
        deadline = time.monotonic() + seconds
        while not docker.works():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text()[-3000:]
                self.stop()
                raise DockerUnavailable(f'dockerd did not start ({" ".join(args)}):\n{tail}', broken=True)
            time.sleep(0.5)
        return docker

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # dockerd stops its containerd and exits
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        netns = self.run_dir / 'exec' / 'netns' / 'default'  # dockerd leaves the host's netns bound there
        if os.path.ismount(netns):
            _run(['umount', '-l', str(netns)], timeout=30)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def engine() -> tuple[Docker, Daemon | None, str]:
    """A working Docker: the one DOCKER_HOST names if it answers, else our own dockerd (installing Debian's
    packages first where they are missing). Returns (docker, the daemon to stop or None, what was done)."""
    for host in (os.environ.get('DOCKER_HOST'), 'unix:///var/run/docker.sock'):
        if host and shutil.which('docker') and Docker(host).works():
            return Docker(host), None, f'the running daemon at {host}'
    done = install_tools()
    daemon = Daemon()
    docker = daemon.start()
    return docker, daemon, (done + '; ' if done else '') + f'started dockerd --bridge=none ({daemon.host})'


def ensure_base(docker: Docker, suite: str) -> str:
    """The base image for `suite`, made with deploy/make-base-image.sh unless the image store has it."""
    tag = BASES[suite]
    if docker.has_image(tag):
        return 'cached'
    if os.geteuid() != 0 or not shutil.which('debootstrap'):
        raise BaseImageMissing(f'base image {tag} is missing and cannot be made here (needs root): {RECIPE}')
    result = _run(
        [str(ROOT / 'deploy' / 'make-base-image.sh'), suite, tag],
        env={**os.environ, 'DOCKER': f'docker -H {docker.host}'},
        timeout=900,
    )
    if result.returncode != 0 or not docker.has_image(tag):
        raise BaseImageMissing(f'making base image {tag} failed: {result.stderr[-2000:]}\nThe recipe: {RECIPE}')
    return f'made: {result.stdout.strip()}'


def project_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / 'pyproject.toml').read_text(), re.M)
    assert match, 'no version in pyproject.toml'
    return match.group(1)


# what the Dockerfile copies: a build from a working tree that differs from HEAD there is labelled "-dirty"
CONTEXT = ['pyproject.toml', 'constraints.txt', 'locks', 'deploy/requirements.py', 'README.md', 'executors', 'flows']
# image tag -> its build arguments, and the constraints.txt, lock and Hub folders it was built from (others may edit
# the working tree meanwhile)
BUILT_WITH: dict[str, dict] = {}


def build_args() -> dict:
    version = project_version()
    git = ['git', '-C', str(ROOT)]
    revision = _run([*git, 'rev-parse', 'HEAD'], timeout=30).stdout.strip() or 'unknown'
    if _run([*git, 'diff', '--quiet', 'HEAD', '--', *CONTEXT], timeout=60).returncode != 0:
        revision += '-dirty'
    source = _run([*git, 'config', '--get', 'remote.origin.url'], timeout=30).stdout.strip()
    return {'VERSION': version, 'REVISION': revision, 'SOURCE': source or f'file://{ROOT}'}


def build(docker: Docker, image: Image, log_dir: Path) -> str:
    """`docker build --network host` of one variant; the base must exist (else an error naming the recipe)."""
    if not docker.has_image(image.base):
        raise BaseImageMissing(f'{image.tag} needs the base image {image.base}, which is missing: {RECIPE}')
    args = {'PYTHON_IMAGE': image.base, 'VARIANT': image.variant, **build_args()}
    hub = ROOT / 'executors' / 'hub'
    BUILT_WITH[image.tag] = {
        **args,
        'constraints.txt': (ROOT / 'constraints.txt').read_text(),
        'lock': (ROOT / 'locks' / f'{image.variant}.txt').read_text(),
        'hub': {p.relative_to(hub.parent).as_posix(): p.read_bytes() for p in sorted(hub.rglob('*')) if p.is_file()},
    }
    command = ['build', '--network', 'host', '-t', image.tag]
    for key, value in args.items():
        command += ['--build-arg', f'{key}={value}']
    log = log_dir / f'build-{image.tag.replace(":", "-")}.log'
    result = docker(*command, str(ROOT), timeout=1800, check=False)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise AssertionError(f'docker build of {image.tag} failed ({log}):\n{(result.stdout + result.stderr)[-4000:]}')
    # The classic builder keeps its cache as untagged images. The runtime image descends from `base`, not from
    # `builder`, so the venv's layers would count as dangling and be pruned: a tag on the builder stage's last
    # layer (the last " ---> ID" before the runtime stage starts) keeps them, and the session's
    # `docker image prune` removes only superseded layers.
    layers = re.findall(r'^ ---> ([0-9a-f]{12})$', result.stdout[: result.stdout.index('FROM base AS runtime')], re.M)
    docker('tag', layers[-1], 'clipserve-build-cache:' + image.tag.split(':')[1])
    return f'{result.stdout.count("Using cache")} cached steps'
