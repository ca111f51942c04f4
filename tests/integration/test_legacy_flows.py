"""The Flows clip-as-service's users already have, behind Jina's own gateway, against ordinary clients.

- the migration guide's YAML exactly as printed in docs/how-to/migrate.md (only the model and the port
  changed: no weights download here, free ports), with ViT-B-32 (random weights), as the regression was seen;
- clip-as-service 0.8.3's shipped `torch-flow.yml` and `onnx-flow.yml` with only `py_modules` changed (their
  executors have no `with:`, so the model and, for ONNX, the backend come from CLIPSERVE_MODEL and
  CLIPSERVE_BACKEND, as the migration guide says);

each served by `jina flow --uses FILE` in a process of its own and called by the unchanged clip-client 0.8.3 at
its defaults (100 requests in flight) from 1 and 4 processes, texts and JPEGs, batch sizes 1, 8, 32 and 3,000
(the other sizes on clip-as-service's torch-flow.yml and the tiny model: the same executor and gateway), and by a
raw Jina client with `prefetch=1000`: every call is answered. Before the replica's queue (engine/admission.py)
the first of these was refused after 0.1 s (`OverloadedError ... max_requests=16`).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docarray import Document, DocumentArray
from jina import Client as JinaClient

from ..docs.blocks import read_blocks
from .conftest import ROOT, TINY, FlowProcess, free_port, make_image

RUN_CLIENT = Path(__file__).parent / 'helpers' / 'clip_client_run.py'

# clip-as-service 0.8.3's server/clip_server/{torch,onnx}-flow.yml, as shipped (py_modules aside)
CAS_TORCH_FLOW = """
jtype: Flow
version: '1'
with:
  port: 51000
executors:
  - name: clip_t
    uses:
      jtype: CLIPEncoder
      metas:
        py_modules:
          - clip_server.executors.clip_torch
    timeout_ready: 3000000
    replicas: 1
"""
CAS_ONNX_FLOW = CAS_TORCH_FLOW.replace('clip_t', 'clip_o').replace('clip_torch', 'clip_onnx')


def migration_guide_yaml() -> dict:
    blocks = [
        b for b in read_blocks(ROOT / 'docs' / 'how-to' / 'migrate.md') if b.marker and b.marker.kind == 'yaml-flow'
    ]
    assert len(blocks) == 1, 'docs/how-to/migrate.md has one YAML Flow'
    config = yaml.safe_load(blocks[0].code)
    config['executors'][0]['uses']['with']['name'] = 'ViT-B-32::random'  # no weights download here
    return config


def clip_as_service_yaml(text: str) -> dict:
    config = yaml.safe_load(text)
    config['executors'][0]['uses']['metas']['py_modules'] = ['clipserve.serving']  # the one line a user changes
    return config


FLOWS = {  # name: (the YAML, its environment, the embedding size)
    'migration-guide': (migration_guide_yaml, {}, 512),
    'cas-torch-flow': (lambda: clip_as_service_yaml(CAS_TORCH_FLOW), {'CLIPSERVE_MODEL': TINY}, 64),
    'cas-onnx-flow': (
        lambda: clip_as_service_yaml(CAS_ONNX_FLOW),
        {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_BACKEND': 'onnx'},
        64,
    ),
}


@pytest.fixture(scope='module', params=list(FLOWS))
def served(request, tmp_path_factory):
    make, env, dim = FLOWS[request.param]
    config = make()
    config['with']['port'] = free_port()
    folder = tmp_path_factory.mktemp(request.param)
    with FlowProcess(config, folder, {'CLIPSERVE_CACHE': str(folder / 'cache'), **env}) as flow:
        images = folder / 'images'
        images.mkdir()
        for i in range(8):
            (images / f'{i}.jpg').write_bytes(make_image(640, 480, seed=i, fmt='JPEG'))
        yield {'name': request.param, 'port': flow.port, 'images': images, 'dim': dim}


def clients(served, n: int, kind: str, count: int, batch_size: int) -> list[dict]:
    """`n` clip-clients at once, each in its own process, each encoding `count` texts or images."""
    command = [sys.executable, str(RUN_CLIENT), f'grpc://127.0.0.1:{served["port"]}', kind, str(count), str(batch_size)]
    processes = [
        subprocess.Popen(
            [*command, str(served['images'])], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for _ in range(n)
    ]
    answers = []
    for process in processes:
        out, _ = process.communicate(timeout=600)
        answers.append(json.loads(out.strip().splitlines()[-1]))
    return answers


def assert_answered(answers: list[dict], count: int, dim: int) -> None:
    for answer in answers:
        assert answer['ok'], answer['error']
        assert answer['shape'] == [count, dim] and answer['finite']


@pytest.mark.parametrize(
    'n, kind, count',
    [(1, 'texts', 1600), (4, 'texts', 400), (4, 'images', 40)],
    ids=['1 client x 1,600 texts', '4 clients x 400 texts', '4 clients x 40 JPEGs'],
)
def test_clip_client_at_its_defaults_is_answered(served, n, kind, count):
    assert_answered(clients(served, n, kind, count, batch_size=8), count, served['dim'])


@pytest.mark.parametrize('batch_size', [1, 32, 3000])
def test_clip_client_is_answered_whatever_its_batch_size(served, batch_size):
    if served['name'] != 'cas-torch-flow':
        pytest.skip("the batch sizes run on clip-as-service's torch-flow.yml")
    count = {1: 300, 32: 3200, 3000: 6000}[batch_size]
    assert_answered(clients(served, 1, 'texts', count, batch_size), count, served['dim'])
    images = {1: 40, 32: 96, 3000: 120}[batch_size]
    assert_answered(clients(served, 1, 'images', images, batch_size), images, served['dim'])


def test_a_raw_jina_client_with_a_prefetch_of_1000_is_answered(served):
    """A thousand one-document requests at once (Jina's gateway forwards as many as the client's prefetch)."""
    if served['name'] != 'cas-torch-flow':
        pytest.skip("runs on clip-as-service's torch-flow.yml")
    docs = DocumentArray([Document(text=f'caption {i}') for i in range(2000)])
    errors = []
    out = JinaClient(host='127.0.0.1', port=served['port']).post(
        '/', docs, request_size=1, prefetch=1000, on_error=lambda r: errors.append(r.header.status.description)
    )
    assert errors == []
    assert len(out) == len(docs) and all(d.embedding is not None and d.embedding.shape == (served['dim'],) for d in out)
