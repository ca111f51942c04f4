"""How the openvino backend's device and precisions become OpenVINO properties, checked before serving.

OpenVINO picks some things by itself that clipserve decides instead: its CPU plugin computes in bf16
on CPUs that have it unless told otherwise, and has no bf16 at all on CPUs without AVX-512. So every
tower is compiled with its precision set explicitly, and a compiled tower that reports another
precision than the one asked for is refused at start rather than served. An Intel GPU asked for but
absent is an error too, never a quiet run on the CPU.
"""

from __future__ import annotations

import os

from clipserve.backends.devices import parse_device
from clipserve.backends.openvino.runtime import ov
from clipserve.errors import BackendUnavailableError

DEVICE_KINDS = ('cpu', 'gpu')  # gpu: an Intel GPU through OpenVINO's GPU plugin
#: clipserve's dtype -> OpenVINO's INFERENCE_PRECISION_HINT (int8: int8 weights, the other operations in f32)
HINTS = {'fp32': 'f32', 'bf16': 'bf16', 'fp16': 'f16', 'int8': 'f32'}
#: activations are quantized in groups of this many values at run time, for the int8 weights' matmuls
DYNAMIC_QUANTIZATION_GROUP = 32


def pick_device(core: ov.Core, device: str | None) -> str:
    """'cpu', 'gpu' or 'gpu:N' for the asked `device`; unset means the CPU (an Intel GPU only when named)."""
    parsed = parse_device(device, 'openvino', DEVICE_KINDS)
    if parsed.kind in (None, 'cpu'):
        return 'cpu'
    present = gpu_indices(core.available_devices)
    wanted = parsed.index if parsed.index is not None else 0
    if wanted not in present:
        seen = ', '.join(core.available_devices) or 'none'
        raise BackendUnavailableError(
            f'device {device!r} was asked for, but OpenVINO {ov.get_version()} sees '
            + (f'no Intel GPU {wanted} (GPUs: {", ".join(f"gpu:{i}" for i in present)})' if present else 'no Intel GPU')
            + f' (its devices: {seen}). Install the Intel GPU driver (compute runtime), or use device "cpu".'
        )
    return str(parsed)


def gpu_indices(available: list[str]) -> list[int]:
    """The indices of the Intel GPUs in OpenVINO's device list ('GPU' alone is GPU.0)."""
    indices = []
    for name in available:
        kind, _, index = name.partition('.')
        if kind == 'GPU':
            indices.append(int(index) if index.isdigit() else 0)
    return sorted(indices)


def openvino_device(device: str) -> str:
    """clipserve's 'gpu:1' as OpenVINO names it: 'GPU.1'."""
    kind, _, index = device.partition(':')
    return kind.upper() + (f'.{index}' if index else '')


def properties(device: str, dtype: str, num_threads: int | None, cache: str | None = None) -> dict:
    """The compile properties of one tower. LATENCY: one stream, every thread on the one request a
    replica runs at a time (THROUGHPUT's streams would each get a share of the cores and wait)."""
    config = {'INFERENCE_PRECISION_HINT': HINTS[dtype], 'PERFORMANCE_HINT': 'LATENCY'}
    if device == 'cpu':
        if num_threads:
            config['INFERENCE_NUM_THREADS'] = int(num_threads)
            # OpenVINO pins its threads to the first cores of the process's set; replicas sharing the
            # cores would all pin to the same ones, so pinning stays on only when this replica has them all.
            config['ENABLE_CPU_PINNING'] = int(num_threads) >= _usable_cores()
        if dtype == 'int8':
            config['DYNAMIC_QUANTIZATION_GROUP_SIZE'] = DYNAMIC_QUANTIZATION_GROUP
    elif cache:
        config['CACHE_DIR'] = cache  # GPU kernels take long to build; OpenVINO reuses them from here
    return config


def compile_tower(core: ov.Core, model: ov.Model, tower: str, device: str, dtype: str, config: dict):
    """`model` compiled for `device` in `dtype`, refused if OpenVINO would compute in anything else."""
    try:
        compiled = core.compile_model(model, openvino_device(device), config)
    except RuntimeError as e:
        if device == 'cpu':
            raise
        raise BackendUnavailableError(
            f'OpenVINO could not compile {tower} for device {device!r} ({openvino_device(device)}): {e}. '
            'Check the Intel GPU driver, or use device "cpu".'
        ) from e
    got = compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()
    if got != HINTS[dtype]:
        raise BackendUnavailableError(
            f'dtype {dtype} was asked for on {device}, but OpenVINO compiled {tower} for {got} '
            f'(this {device} cannot compute {HINTS[dtype]}); choose another dtype, e.g. "fp32"'
        )
    return compiled


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
