"""An install with only the `onnx` extra (no torch) serves an exported model: a fresh virtual environment, for real.

This is the slowest test (a pip install of jina and onnxruntime, ~1-3 minutes with a warm pip cache).
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from clip_client import Client
from jina import Client as JinaClient

from .conftest import ROOT, TINY, free_port, set_port


@pytest.mark.slow
def test_onnx_extra_alone_serves_an_exported_model(tmp_path, tiny_backend):
    from clipserve.backends.onnx_export import export_onnx
    from clipserve.models.tokenizer import Tokenizer

    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    pip = [str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '-q', '-c', str(ROOT / 'constraints.txt')]
    subprocess.run(pip + ['-e', f'{ROOT}[onnx]'], check=True, cwd=ROOT)
    probe = subprocess.run([str(venv / 'bin' / 'python'), '-c', 'import torch'], capture_output=True)
    assert probe.returncode != 0, 'the onnx extra must not install torch'

    exported = tmp_path / 'onnx'
    export_onnx(TINY, exported)  # exporting needs torch: done here, served from the torch-free venv
    port = free_port()
    config = set_port(yaml.safe_load((ROOT / 'flows' / 'onnx.yml').read_text()), port)
    flow_file = tmp_path / 'onnx.yml'
    flow_file.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, 'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_MODEL_PATH': str(exported), 'COLUMNS': '1000'}
    log = open(tmp_path / 'flow.log', 'w')
    server = subprocess.Popen(
        [str(venv / 'bin' / 'jina'), 'flow', '--uses', str(flow_file)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not JinaClient(host='127.0.0.1', port=port).is_flow_ready(timeout=1):
            assert server.poll() is None, (tmp_path / 'flow.log').read_text()[-3000:]
            assert time.time() < deadline, 'not ready in 120 s'
            time.sleep(1)
        texts = ['a photo of a dog', 'served without torch']
        out = Client(f'grpc://127.0.0.1:{port}').encode(texts)
        tokens = Tokenizer()(texts)
        expected = tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask)
        assert np.abs(out - expected).max() < 1e-4
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
