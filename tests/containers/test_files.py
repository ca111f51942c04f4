"""The container files read as files (no Docker needed, so these run everywhere): the Dockerfile's layer
order and labels, deploy/requirements.py, and deploy/compose.yml's wiring and schema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .engine import ROOT, project_version

DOCKERFILE = (ROOT / 'Dockerfile').read_text()
COMPOSE = ROOT / 'deploy' / 'compose.yml'


def test_dockerfile_pulls_no_frontend_and_installs_dependencies_before_code():
    # BuildKit pulls the image a `# syntax=` line names before it builds: no registry, no build
    assert not re.search(r'^#\s*syntax\s*=', DOCKERFILE, re.M | re.I)
    builder = DOCKERFILE[DOCKERFILE.index('FROM base AS builder') : DOCKERFILE.index('FROM base AS runtime')]
    order = [
        'COPY pyproject.toml constraints.txt ./',
        'COPY locks ./locks',
        'RUN /opt/venv/bin/pip install --no-deps --require-hashes -r locks/base.txt',  # shared by every variant
        'ARG VARIANT',  # RUNs after it depend on the variant
        'RUN set -eu;',  # the variant's dependencies
        'COPY README.md ./',
        'COPY executors/clipserve ./executors/clipserve',
        'RUN /opt/venv/bin/pip install --no-deps --no-build-isolation -c constraints.txt .',
    ]
    positions = [builder.index(step) for step in order]
    assert positions == sorted(positions), order


def test_labels_name_the_version_licence_source_and_revision():
    final = DOCKERFILE[DOCKERFILE.index('FROM variant-${VARIANT} AS final') :]
    assert re.search(rf'^ARG VERSION={re.escape(project_version())}$', final, re.M), 'ARG VERSION != pyproject.toml'
    labels = dict(re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', final))
    assert labels['org.opencontainers.image.version'] == '${VERSION}'
    assert labels['org.opencontainers.image.source'] == '${SOURCE}'
    assert labels['org.opencontainers.image.revision'] == '${REVISION}'
    licence = re.search(r'^license = "([^"]+)"', (ROOT / 'pyproject.toml').read_text(), re.M).group(1)
    assert labels['org.opencontainers.image.licenses'] == licence


def _requirements(*extras: str) -> subprocess.CompletedProcess:
    script = ROOT / 'deploy' / 'requirements.py'
    return subprocess.run([sys.executable, script, *extras], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_requirements_helper_prints_pyprojects_dependencies():
    tomllib = pytest.importorskip('tomllib')
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    assert _requirements().stdout.split('\n')[:-1] == project['dependencies']
    onnx = _requirements('onnx').stdout.split('\n')[:-1]
    assert onnx == project['dependencies'] + [r for r in project['optional-dependencies']['onnx']]
    both = _requirements('onnx,openvino').stdout.split('\n')[:-1]
    assert set(both) == set(onnx) | set(project['optional-dependencies']['openvino'])
    unknown = _requirements('no-such-extra')
    assert unknown.returncode != 0 and 'no extra no-such-extra' in unknown.stderr


def _defaults(text: str) -> str:
    """Compose's interpolation with every variable unset: ${NAME:-default} -> default, and a required
    ${NAME:?message} -> /NAME."""
    return re.sub(r'\$\{([A-Z0-9_]+):\?[^}]*\}', r'/\1', re.sub(r'\$\{[A-Z0-9_]+:-([^}]*)\}', r'\1', text))


def test_compose_file_is_host_networked_and_wired():
    services = yaml.safe_load(_defaults(COMPOSE.read_text()))['services']
    assert set(services) == {'gateway', 'encoder-0', 'encoder-1', 'ranker'}
    ports = {}
    for name, service in services.items():
        assert service['network_mode'] == 'host' and 'ports' not in service, name  # no bridge, no NAT
        assert service['image'] == 'clipserve:cpu-onnx' and 'healthcheck' in service, name
        command = service['command']
        if name != 'gateway':
            assert service['entrypoint'] == ['jina', 'executor'], name
            assert command[command.index('--host') + 1] == '127.0.0.1', name  # only the gateway is reachable
            ports[name] = command[command.index('--port') + 1]
            assert ports[name] in service['healthcheck']['test'][-1], name
    gateway = services['gateway']['command']
    graph = json.loads(gateway[gateway.index('--graph-description') + 1])
    assert graph == {'start-gateway': ['encoder'], 'encoder': ['ranker'], 'ranker': ['end-gateway']}
    addresses = json.loads(gateway[gateway.index('--deployments-addresses') + 1])
    assert addresses == {
        'encoder': [f'127.0.0.1:{ports["encoder-0"]}', f'127.0.0.1:{ports["encoder-1"]}'],
        'ranker': [f'127.0.0.1:{ports["ranker"]}'],
    }
    assert len(set(ports.values())) == 3


def test_compose_file_passes_the_compose_specification(tmp_path):
    resolved = tmp_path / 'compose.yml'  # as compose reads it, with the variables at their defaults
    resolved.write_text(_defaults(COMPOSE.read_text()))
    checker = Path(sys.executable).parent / 'check-jsonschema'  # the test extra's; ships the compose-spec schema
    result = subprocess.run(
        [str(checker), '--builtin-schema', 'vendor.compose-spec', str(resolved)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
