"""The README's serving command, for real: `jina flow --uses flows/torch.yml` in a subprocess."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from clip_client import Client
from jina import Client as JinaClient

from .conftest import make_image, stop_process

ROOT = Path(__file__).resolve().parents[2]
JINA = str(Path(sys.executable).parent / 'jina')


def start_flow(env_extra, log_path):
    env = {**os.environ, 'NO_VERSION_CHECK': '1', 'COLUMNS': '1000', **env_extra}  # rich must not wrap the log
    # a file, not a pipe: jina's tracebacks can fill a pipe's buffer and block the process
    log = open(log_path, 'w')
    process = subprocess.Popen(
        [JINA, 'flow', '--uses', 'flows/torch.yml'],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    process.log_path = log_path
    return process


def stop(process):
    stop_process(process)
    return Path(process.log_path).read_text()


def test_torch_yml_serves_clip_client(tmp_path):
    process = start_flow({'CLIPSERVE_MODEL': 'ViT-B-32::random'}, tmp_path / 'flow.log')
    try:
        deadline = time.time() + 180
        while not JinaClient(host='127.0.0.1', port=51000).is_flow_ready(timeout=1):
            assert process.poll() is None, stop(process)
            assert time.time() < deadline, 'the Flow did not become ready in 180 s'
            time.sleep(1)
        jpeg = tmp_path / 'dog.jpg'
        jpeg.write_bytes(make_image(640, 480, fmt='JPEG'))
        out = Client('grpc://127.0.0.1:51000').encode(['a photo of a dog', str(jpeg)])
        assert isinstance(out, np.ndarray) and out.shape == (2, 512) and out.dtype == np.float32
    finally:
        stop(process)


def test_offline_default_model_fails_at_once_with_guidance(tmp_path):
    process = start_flow({'CLIPSERVE_CACHE': str(tmp_path / 'cache'), 'HF_HUB_OFFLINE': '1'}, tmp_path / 'flow.log')
    try:
        process.wait(120)
    except subprocess.TimeoutExpired:
        pytest.fail('the Flow kept running without weights: ' + stop(process)[-3000:])
    output = stop(process)
    assert process.returncode != 0
    for fragment in ('ViT-B-32::openai', str(tmp_path / 'cache'), 'ViT-B-32::random', '.safetensors'):
        assert fragment in output, output[-3000:]
