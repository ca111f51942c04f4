"""`pip install '.[client]'` in a fresh virtual environment: no torch, and the client works from there.

Slow (a pip install of jina and its dependencies, ~1-2 minutes with a warm pip cache).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.integration.conftest import ROOT

from .conftest import url


@pytest.mark.slow
def test_the_client_extra_installs_no_torch_and_works(tmp_path, plain_flow):
    source = tmp_path / 'source'  # a copy, so the wheel build leaves no build/ folder in the checkout
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            '.git', '.venv', 'build', '*.egg-info', '__pycache__', '.pytest_cache', 'tests', 'benchmarks'
        ),
    )
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    python = str(venv / 'bin' / 'python')
    subprocess.run(
        [python, '-m', 'pip', 'install', '-q', '-c', str(ROOT / 'constraints.txt'), f'{source}[client]'],
        check=True,
        cwd=tmp_path,
    )
    probe = subprocess.run([python, '-c', 'import torch'], capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0, 'the client extra must not install torch'

    code = textwrap.dedent(f"""
        import sys
        from clipserve_client import Client
        out = Client({url('grpc', plain_flow['grpc'])!r}).encode(['a photo of a dog', 'works without torch'])
        print('SHAPE', out.shape, 'TORCH', 'torch' in sys.modules, 'SERVER', 'clipserve' in sys.modules)
    """)
    result = subprocess.run(
        [python, '-c', code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, 'NO_VERSION_CHECK': '1'},
    )
    assert 'SHAPE (2, 64) TORCH False SERVER False' in result.stdout, result.stderr[-3000:]
