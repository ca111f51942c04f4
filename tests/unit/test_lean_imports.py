"""Triton stays out of a CPU torch replica, and only there. Each case runs in a fresh interpreter:
whether Triton can be imported is process state, and this test process may hold it already."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import TINY

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec('triton') is None, reason='triton is not installed here, so there is nothing to keep out'
)

CHECK = """
import sys
from clipserve.backends.torch.lean_imports import keep_triton_out
print('kept out:', keep_triton_out({device!r}))
import open_clip
from torch.utils._triton import has_triton_package
print('triton imported:', sys.modules.get('triton') is not None, 'has_triton_package:', has_triton_package())
"""


def run(code: str, **env) -> list[str]:
    done = subprocess.run(
        [sys.executable, '-c', code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_on_the_cpu_triton_is_kept_out_and_the_model_still_encodes():
    lines = run(
        CHECK.format(device='cpu')
        + f"""
from clipserve.backends import BackendOptions, create_backend
from clipserve.models.tokenizer import Tokenizer
backend = create_backend('torch', {TINY!r}, BackendOptions(device='cpu'))
print('encoded:', backend.encode_texts(Tokenizer()(['a dog']).input_ids).shape == (1, backend.embed_dim))
"""
    )
    assert lines[-3:] == ['kept out: True', 'triton imported: False has_triton_package: False', 'encoded: True']


def test_auto_device_on_a_machine_without_cuda_counts_as_the_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA: auto means the GPU, where Triton stays')
    assert run(CHECK.format(device=None))[-2:] == ['kept out: True', 'triton imported: False has_triton_package: False']


@pytest.mark.parametrize('device, env', [('cuda', {}), ('cpu', {'CLIPSERVE_KEEP_TRITON': '1'})])
def test_gpu_devices_and_the_opt_out_keep_triton(device, env):
    lines = run(CHECK.format(device=device), **env)
    assert lines[-2:] == ['kept out: False', 'triton imported: True has_triton_package: True']


def test_nothing_changes_once_triton_is_imported():
    lines = run('import triton\n' + CHECK.format(device='cpu'))
    assert lines[-2:] == ['kept out: False', 'triton imported: True has_triton_package: True']
