"""CI for the DocArray v2 flavour, started by the README's test command from the main (v1) environment.

docarray v1 and v2 share one import name, so the v2 tests need an environment of their own: this module
builds `.venv-v2` once (`python3 -m venv` + `pip install -c constraints-v2.txt -e '.[onnx,docarray-v2,search]' pytest httpx`;
rebuilt when constraints-v2.txt or pyproject.toml change, and ignored by git), exports the tiny model to ONNX
(the v2 environment has no torch), encodes tests/v2/inputs.py with a real v1 Flow serving that export, and
runs `pytest tests/v2` inside `.venv-v2` against those embeddings. It fails when they fail, when the
environment cannot be built, or when they ran no test.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from tests.v2.inputs import EXPORT_ENV, IMAGES, REFERENCE_ENV, TEXTS, TINY

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / '.venv-v2'
PYTHON = VENV / 'bin' / 'python'
INSTALL = ['-c', 'constraints-v2.txt', '-e', '.[onnx,docarray-v2,search]', 'pytest', 'httpx']


def recipe_digest() -> str:
    """What the v2 environment is made from: a change to any of it rebuilds it."""
    digest = hashlib.sha256(' '.join(INSTALL).encode())
    for name in ('constraints-v2.txt', 'pyproject.toml'):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()[:16]


def v2_environment() -> Path:
    """.venv-v2, made once per recipe (a marker file names it); test processes running together wait for one."""
    marker = VENV / f'.clipserve-{recipe_digest()}'
    with FileLock(str(ROOT / '.venv-v2.lock')):
        if not marker.is_file():
            started = time.monotonic()
            subprocess.run(['rm', '-rf', str(VENV)], check=True)
            made = subprocess.run([sys.executable, '-m', 'venv', str(VENV)], capture_output=True, text=True)
            assert made.returncode == 0, made.stderr[-2000:]
            pip = [str(PYTHON), '-m', 'pip', 'install', '-q', '--disable-pip-version-check', *INSTALL]
            done = subprocess.run(pip, cwd=ROOT, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f'cannot build {VENV}:\n{done.stderr[-3000:]}'
            marker.write_text(f'built in {time.monotonic() - started:.0f}s\n')
    return PYTHON


def v1_reference(export: Path, out: Path) -> Path:
    """The v1 Flow's embeddings of the test inputs (texts; images as PNG blobs) for the same ONNX export."""
    from docarray import Document, DocumentArray
    from jina import Client, Flow

    from clipserve import CLIPEncoder
    from tests.integration.conftest import free_port

    port = free_port()
    flow = Flow(port=port).add(uses=CLIPEncoder, uses_with={'name': TINY, 'backend': 'onnx', 'model_path': str(export)})
    with flow:
        docs = DocumentArray([Document(text=t) for t in TEXTS] + [Document(blob=b) for b in IMAGES])
        answer = Client(host='127.0.0.1', port=port).post('/encode', docs, results_in_order=True)
    embeddings = np.asarray(answer.embeddings, dtype=np.float32)
    np.savez(out, texts=embeddings[: len(TEXTS)], images=embeddings[len(TEXTS) :])
    return out


def test_the_docarray_v2_suite_passes_in_its_own_environment(tmp_path):
    from clipserve.backends.onnx.export import export_onnx

    python = v2_environment()
    export = tmp_path / 'tiny-onnx'
    export_onnx(TINY, export)
    reference = v1_reference(export, tmp_path / 'v1-reference.npz')
    env = {**os.environ, EXPORT_ENV: str(export), REFERENCE_ENV: str(reference), 'PYTHONDONTWRITEBYTECODE': '1'}
    env.pop('PYTHONPATH', None)
    command = [str(python), '-m', 'pytest', 'tests/v2', '-q', '-p', 'no:cacheprovider', '-W', 'ignore']
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    print(output[-6000:])
    if done.returncode != 0:
        pytest.fail(f'tests/v2 failed in {VENV} (exit {done.returncode}):\n{output[-12000:]}')
    assert ' passed' in output and ' failed' not in output and ' skipped' not in output, output[-3000:]
