"""The Executor Hub consumer's path: deploy/docker-executor-flow.yml runs the encoder from the built image
(`uses: docker://clipserve:cpu-onnx`, which Jina starts itself) and serves clip-client; and the Hub folders
in the image are the repository's, with extras and pins the image's Python agrees with.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import yaml

from ..integration.conftest import free_port, wait_for
from .clients import MIN_COSINE, TINY, clip_client_embeddings, cosines, executor_info
from .conftest import ROOT, SUMMARY
from .contents import image_facts
from .engine import BUILT_WITH, IMAGES

HUB = ROOT / 'executors' / 'hub'


def test_a_flow_runs_the_encoder_from_the_image(containers, references, monkeypatch, tmp_path):
    from jina import Flow

    onnx_reference = references['onnx.yml']
    docker = containers.docker
    image = IMAGES['cpu-onnx'].tag
    config = yaml.safe_load((ROOT / 'deploy' / 'docker-executor-flow.yml').read_text())
    port = free_port()
    config['with']['port'] = port
    [executor] = config['executors']
    assert executor['uses'] == f'docker://{image}'
    path = tmp_path / 'docker-executor-flow.yml'
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    monkeypatch.setenv('DOCKER_HOST', docker.host)  # Jina's docker client
    monkeypatch.setenv('CLIPSERVE_MODEL', TINY)
    monkeypatch.setenv('CLIPSERVE_MODEL_DIR', str(containers.model_dir))
    if Path('/.dockerenv').exists():
        # Jina takes a process on a machine with /.dockerenv (as CI's) for one inside a container and gives the
        # gateway the address host.docker.internal, which resolves only inside containers. On a plain host it
        # uses the executor's host (127.0.0.1 here): the same as this.
        import jina.orchestrate.deployments as deployments

        monkeypatch.setattr(deployments, 'in_docker', lambda: False)
    flow = Flow.load_config(str(path))

    def ours():
        listed = docker('ps', '--filter', f'ancestor={image}', '--format', '{{.ID}} {{.Command}}').stdout
        return [line for line in listed.splitlines() if 'jina executor' in line]

    before = set(ours())
    with flow:
        started = [line for line in ours() if line not in before]
        assert len(started) == 1, started  # Jina started one container of the image, running the hub config
        container = started[0].split()[0]
        settings = docker('inspect', '--format', '{{.HostConfig.NetworkMode}} {{.Config.User}}', container).stdout
        assert settings.split() == ['host', '10001:10001'], settings
        got = clip_client_embeddings(port)
        [info] = executor_info(port).values()
    assert cosines(got, onnx_reference).min() >= MIN_COSINE
    assert info['backend'] == 'onnx' and info['model'] == TINY and not info['torch_imported'], info
    wait_for(lambda: not set(ours()) - before, 60, "Jina to remove the executor's container")
    SUMMARY.append(
        f'docker:// Flow (deploy/docker-executor-flow.yml): {image} started by Jina, clip-client cosine min '
        f'{cosines(got, onnx_reference).min():.7f} vs flows/onnx.yml from source; container removed on close'
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize('name', list(IMAGES))
def test_hub_folders_in_the_image_are_the_repositorys(containers, name):
    tag = IMAGES[name].tag
    facts = image_facts(containers.docker, tag)
    built_from = BUILT_WITH[tag]['hub']  # {'hub/CLIPEncoder/config.yml': bytes, ...} when the image was built
    assert {k: v for k, v in facts['files'].items() if k != 'config.yml'} == {
        k: _digest(v) for k, v in built_from.items()
    }
    assert facts['files']['config.yml'] == _digest(built_from['hub/CLIPEncoder/config.yml'])  # the default EXECUTOR
    extras = set(facts['clipserve_extras'])
    for folder in sorted({path.split('/')[1] for path in built_from}):
        text = built_from[f'hub/{folder}/requirements.txt'].decode()
        [constraint] = [line for line in text.splitlines() if line.startswith('-c ')]
        assert (HUB / folder / constraint.split()[1]).resolve() == ROOT / 'constraints.txt'  # the pins the image has
        # the extras it installs and those its comments offer (onnx, openvino): the image's clipserve has each
        named = {extra for group in re.findall(r'\[([a-z0-9,-]+)\]', text) for extra in group.split(',')}
        assert named and named <= extras, (folder, named - extras)
