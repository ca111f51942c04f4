"""Device names, parsed and checked the same way for every backend, before any model is loaded.

`None`, '' and 'auto' leave the choice to the backend (CUDA when present); 'cpu', 'cuda' and 'cuda:N'
name a device, and for the openvino backend 'gpu', 'gpu:N' (or OpenVINO's own 'gpu.N') an Intel GPU.
Anything else, and an index beyond the visible GPUs, is a clear error at start rather than a failure
deep inside a runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clipserve.errors import BackendUnavailableError

_DEVICE = re.compile(r'(cpu|cuda|mps|gpu)(?::(\d+))?')
_OPENVINO_GPU = re.compile(r'gpu\.(\d+)')  # OpenVINO spells the second Intel GPU GPU.1
INDEXED = ('cuda', 'gpu')  # the kinds that take an index


@dataclass(frozen=True)
class Device:
    kind: str | None  # 'cpu', 'cuda', 'mps', 'gpu' (an Intel GPU, openvino); None = the backend picks
    index: int | None = None  # for cuda:N and gpu:N

    def __str__(self) -> str:
        return f'{self.kind}:{self.index}' if self.index is not None else str(self.kind)


def parse_device(device, backend: str, kinds: tuple[str, ...] = ('cpu', 'cuda')) -> Device:
    """`device` as a Device, or BackendUnavailableError naming what `backend` accepts."""
    if device is None or str(device).strip().lower() in ('', 'auto'):
        return Device(None)
    text = _OPENVINO_GPU.sub(r'gpu:\1', str(device).strip().lower())
    match = _DEVICE.fullmatch(text)
    accepted = ', '.join(f'"{k}"' for k in kinds) + ''.join(f', "{k}:N"' for k in INDEXED if k in kinds)
    if not match or match.group(1) not in kinds or (match.group(2) is not None and match.group(1) not in INDEXED):
        raise BackendUnavailableError(f'unknown device {device!r} for the {backend} backend; use {accepted}')
    return Device(match.group(1), int(match.group(2)) if match.group(2) is not None else None)


def check_index(device: Device, visible: int, backend: str, detail: str = '') -> None:
    """Refuse cuda:N when only `visible` GPUs are visible (N counts from 0, as CUDA_VISIBLE_DEVICES orders them)."""
    if device.kind == 'cuda' and device.index is not None and device.index >= visible:
        raise BackendUnavailableError(
            f'device {str(device)!r} was asked for, but the {backend} backend sees {visible} CUDA device(s)'
            f'{detail} (indices start at 0 and follow CUDA_VISIBLE_DEVICES); pick one of '
            f'{", ".join(f"cuda:{i}" for i in range(visible)) or "none"}, or device "cpu"'
        )
