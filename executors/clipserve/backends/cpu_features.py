"""What the running CPU computes natively, read once: one answer for precision choices, benchmarks and tests.

The kernels of onnxruntime, OpenVINO, oneDNN and numpy are chosen from the CPUID instruction, so the
view that matters is CPUID's, not /proc/cpuinfo's: under an emulator (`qemu-x86_64 -cpu Haswell`, how
the test suite reproduces an AVX2-only CPU on an AVX-512 machine) /proc/cpuinfo still describes the
host. numpy asks CPUID at import; its answer is the ground truth here. /proc/cpuinfo adds only what
numpy does not name (AMX, AVX-VNNI), and only where CPUID's answer makes it possible.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from functools import lru_cache

# numpy's CPUID feature names -> the Linux flag names clipserve speaks
_FROM_NUMPY = {
    'AVX': 'avx',
    'AVX2': 'avx2',
    'FMA3': 'fma',
    'F16C': 'f16c',
    'AVX512F': 'avx512f',
    'AVX512BW': 'avx512bw',
    'AVX512VL': 'avx512vl',
    'AVX512DQ': 'avx512dq',
    'AVX512VNNI': 'avx512_vnni',
    'AVX512BF16': 'avx512_bf16',
    'AVX512FP16': 'avx512_fp16',
    'ASIMD': 'asimd',
    'ASIMDDP': 'asimddp',
}
# flags numpy does not report, taken from /proc/cpuinfo where CPUID shows the extension they build on.
# AVX-VNNI is believed only beside AVX-512: under an emulated AVX2 CPU /proc/cpuinfo still shows the host's
# avx_vnni, and trusting it there chose kernels' inputs the emulated CPU saturates. A real AVX-VNNI CPU
# without AVX-512 is therefore treated as AVX2 (7-bit int8 weights, OpenVINO int8 refused): safe, a little slower.
_NEEDS = {'amx_bf16': 'avx512f', 'amx_int8': 'avx512f', 'amx_tile': 'avx512f', 'avx_vnni': 'avx512f', 'bf16': 'asimd'}

BF16_FLAGS = ('amx_bf16', 'avx512_bf16', 'bf16')  # bf16 arithmetic in hardware (x86; 'bf16' is Arm's)
VNNI_FLAGS = ('amx_int8', 'avx512_vnni', 'avx_vnni', 'asimddp')  # int8 dot products in one instruction


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction-set extensions this process's kernels can use, as Linux names them."""

    flags: frozenset[str]
    machine: str = ''
    readable: bool = True  # False: neither CPUID (through numpy) nor /proc/cpuinfo answered

    def has(self, *flags: str) -> bool:
        return all(f in self.flags for f in flags)

    @property
    def native_bf16(self) -> list[str]:
        return [f for f in BF16_FLAGS if f in self.flags]

    @property
    def int8_dot(self) -> list[str]:
        return [f for f in VNNI_FLAGS if f in self.flags]

    @property
    def kind(self) -> str:
        """'avx512-bf16', 'avx512-vnni', 'avx512', 'avx2', 'arm64', 'older x86' or 'unknown'."""
        if not self.readable:
            return 'unknown'
        if self.has('avx512f'):
            if self.native_bf16:
                return 'avx512-bf16'
            return 'avx512-vnni' if 'avx512_vnni' in self.flags else 'avx512'
        if self.has('avx2', 'fma'):
            return 'avx2'
        if 'asimd' in self.flags:
            return 'arm64'
        return 'older x86'

    def describe(self) -> str:
        """One line for ready lines and benchmark tables."""
        shown = [f for f in ('avx2', 'fma', 'avx512f', *VNNI_FLAGS, *BF16_FLAGS) if f in self.flags]
        return f'{self.kind} ({", ".join(shown) or "none of avx2/avx512/vnni/bf16"})'


@lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """This CPU's features, read once per process."""
    return combine(numpy_cpuid_flags(), read_cpuinfo_flags(), platform.machine())


def combine(cpuid: set[str] | None, cpuinfo: set[str] | None, machine: str = '') -> CpuFeatures:
    """CPUID's flags, plus the /proc/cpuinfo flags it cannot name whose base extension CPUID confirms."""
    if cpuid is None:
        if cpuinfo is None:
            return CpuFeatures(frozenset(), machine, readable=False)
        return CpuFeatures(frozenset(cpuinfo), machine)
    flags = set(cpuid)
    for flag, base in _NEEDS.items():
        if cpuinfo and flag in cpuinfo and base in cpuid:
            flags.add(flag)
    return CpuFeatures(frozenset(flags), machine)


def numpy_cpuid_flags() -> set[str] | None:
    """The features numpy found with CPUID at import (None if this numpy does not say)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as found
        except ImportError:
            return None
    return {ours for theirs, ours in _FROM_NUMPY.items() if found.get(theirs)}


def read_cpuinfo_flags(path: str = '/proc/cpuinfo') -> set[str] | None:
    """The first 'flags' (x86) or 'Features' (Arm) line of /proc/cpuinfo; None where there is none."""
    try:
        with open(path, encoding='ascii', errors='replace') as f:
            for line in f:
                key = line.partition(':')[0].strip()
                if key in ('flags', 'Features'):
                    return set(line.partition(':')[2].split())
    except OSError:
        return None
    return None
