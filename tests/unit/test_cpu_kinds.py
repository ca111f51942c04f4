"""The precision-sensitive tests (marker `precision`) on the other kind of CPU than this one, where that can be had.

onnxruntime, OpenVINO, oneDNN and numpy choose their kernels from CPUID, so on an AVX-512 machine the
AVX2 kernels never run, and an int8 that keeps rankings here can break them on an AVX2-only server
(it did). Debian's qemu-user runs this test suite's Python as a Haswell CPU (AVX2 + FMA, no AVX-512,
no VNNI, no bf16): its CPUID says so, every library picks its AVX2 kernels, and the results are those
of a real AVX2 machine, to the digit (measured against one). Under emulation the tests that need no torch
run (ONNX Runtime's and OpenVINO's kernels, the precision choice), on an export made natively beforehand;
torch's own kernels are switched to AVX2 natively instead (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), which
is exact for them and many times faster. On an AVX2-only machine these tests have already run natively on
AVX2 kernels; AVX-512 cannot be emulated there (QEMU's TCG has no AVX-512), so the AVX-512 kernels are
tested where CI lands on such a machine.
"""

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clipserve.backends.cpu_features import cpu_features

from ..conftest import TINY_EXPORT_ENV

ROOT = Path(__file__).resolve().parents[2]
EMULATED_CPU = 'Haswell'
EXPECT_ENV = 'CLIPSERVE_TEST_EXPECT_CPU_KIND'  # set for the emulated run; checked by the test below
# the `precision` tests that need no torch, run under emulation (several times slower than native)
EMULATED = [
    'tests/unit/test_cpu_kinds.py',
    'tests/unit/test_precision.py',
    'tests/unit/test_onnx_int8.py',
    'tests/unit/test_onnx_attention.py',
    'tests/unit/test_onnx_pooled_rows.py',
    'tests/unit/test_openvino_backend.py',
]
NEEDS_TORCH = 'not equals_torch and not cpus_only'  # their torch halves run in the native AVX2 run below
TORCH = ['tests/unit/test_torch_backend.py', 'tests/unit/test_torch_packed_weights.py']
TORCH_AVX2 = {'ATEN_CPU_CAPABILITY': 'avx2', 'ONEDNN_MAX_CPU_ISA': 'AVX2'}


@pytest.mark.precision
def test_the_cpu_kind_is_the_one_this_run_expects():
    """In the emulated run, every library must see the emulated CPU, or the run would prove nothing."""
    expected = os.environ.get(EXPECT_ENV)
    features = cpu_features()
    if expected is None:
        assert features.kind != 'unknown' or platform.machine() not in ('x86_64', 'AMD64')
        return
    assert features.kind == expected, f'the emulated run sees {features.describe()}, not {expected}'
    assert not features.native_bf16 and 'avx512_vnni' not in features.flags


def _pytest(command: list[str], env: dict, what: str, timeout: int) -> None:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    output = (done.stdout + done.stderr)[-6000:]
    print(f'\n{what}:\n{done.stdout[-2500:]}')
    assert done.returncode == 0, output
    assert ' passed' in done.stdout and ' failed' not in done.stdout, output


def test_precision_tests_pass_on_an_emulated_avx2_cpu(tiny_onnx_export):
    features = cpu_features()
    if platform.machine() not in ('x86_64', 'AMD64'):
        pytest.skip(f'qemu-user emulates x86 CPUs; this machine is {platform.machine()}')
    if features.kind == 'avx2':
        pytest.skip('this CPU is AVX2-only: the precision tests ran natively on its AVX2 kernels')
    qemu = shutil.which('qemu-x86_64')
    if qemu is None:
        message = "qemu-user is not installed (apt-get install qemu-user): the AVX2 kernels' run is missing"
        if os.environ.get('CI'):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, 'PYTHONDONTWRITEBYTECODE': '1', TINY_EXPORT_ENV: str(tiny_onnx_export)}
    quiet = ['-q', '-p', 'no:cacheprovider', '-W', 'ignore', '-m', 'precision']
    emulated = [qemu, '-cpu', EMULATED_CPU, sys.executable, '-m', 'pytest', *quiet, '-k', NEEDS_TORCH, *EMULATED]
    _pytest(emulated, {**env, EXPECT_ENV: 'avx2'}, f'on an emulated {EMULATED_CPU} (AVX2) CPU', 1500)
    _pytest([sys.executable, '-m', 'pytest', *quiet, *TORCH], {**env, **TORCH_AVX2}, "torch's AVX2 kernels", 600)
