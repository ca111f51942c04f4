"""Which precisions each backend computes on each kind of device, and the default: one table for all.

`None`, '' and 'auto' mean the default for the backend and device; anything the table does not list
for them is a clear error at start (never a silent change of precision).

On a CPU, `auto` follows the rule the GPUs follow (the fastest precision the hardware computes
natively): bf16 where the CPU has bf16 instructions (AVX512-BF16 or AMX, read from the CPU's flags at
start), fp32 elsewhere, for both towers, as fp16 is on GPUs (docs/concepts/precision.md has what each
costs). The table can give the towers different precisions (`CPU_BF16_AUTO`); the torch backend then casts the
image tower alone. `fp32` stays available for bit-exact parity with open_clip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from clipserve import environment
from clipserve.backends.cpu_features import BF16_FLAGS, cpu_features
from clipserve.errors import BackendUnavailableError

DTYPES = ('fp32', 'fp16', 'bf16')  # what torch computes; onnx adds int8 on CPUs (a quantized copy)

# backend -> device kind -> (default, accepted)
PRECISIONS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    'torch': {'cpu': ('fp32', DTYPES), 'cuda': ('fp16', DTYPES), 'mps': ('fp16', DTYPES)},
    'onnx': {'cpu': ('fp32', ('fp32', 'int8')), 'cuda': ('fp16', ('fp32', 'fp16'))},
    'tensorrt': {'cuda': ('fp16', ('fp32', 'fp16'))},
    # int8 here: int8 MatMul weights, activations quantized by OpenVINO at run time (openvino_int8.py)
    'openvino': {'cpu': ('fp32', ('fp32', 'bf16', 'int8')), 'gpu': ('fp16', ('fp32', 'fp16'))},
}

#: backend -> (images, texts) that `auto` picks on a CPU with native bf16 (other backends keep fp32 there)
CPU_BF16_AUTO: dict[str, tuple[str, str]] = {'torch': ('bf16', 'bf16'), 'openvino': ('bf16', 'bf16')}

_WHY_NOT = {
    ('onnx', 'cpu', 'fp16'): 'fp16 ONNX models run on CUDA only',
    ('onnx', 'cpu', 'bf16'): 'onnxruntime has no fast bf16 kernels for CPUs; use int8 (a quantized copy) or fp32',
    ('tensorrt', 'cuda', 'bf16'): 'the tensorrt backend builds fp16 or fp32 engines',
    ('torch', 'cpu', 'int8'): 'int8 runs on the onnx and openvino backends (int8 weights of the export)',
    ('onnx', 'cuda', 'int8'): 'int8 ONNX copies run on CPUs (dynamic quantization); use fp16 on CUDA',
    ('openvino', 'cpu', 'fp16'): "OpenVINO's CPU plugin computes fp32, bf16 or int8",
    ('openvino', 'gpu', 'bf16'): 'the openvino backend runs fp16 or fp32 on Intel GPUs',
    ('openvino', 'gpu', 'int8'): 'int8 weights are quantized for CPUs only; use fp16 on Intel GPUs',
}

CPU_BF16_ENV = environment.CPU_BF16.name  # '1' or '0' overrides what the CPU's flags say (tests, odd hypervisors)


@dataclass(frozen=True)
class Precision:
    """What each tower computes in, and why: shown in the ready line and /clipserve/info."""

    images: str
    texts: str
    reason: str

    @property
    def name(self) -> str:
        """One word when both towers agree ('fp32'), else both ('bf16 images, fp32 texts')."""
        return self.images if self.images == self.texts else f'{self.images} images, {self.texts} texts'

    def as_dict(self) -> dict:
        return {'images': self.images, 'texts': self.texts, 'reason': self.reason}


def resolve_dtype(backend: str, device: str, dtype: str | None) -> str:
    """The one precision `backend` runs on `device` ('cpu', 'cuda', 'cuda:1', ...) for the asked `dtype`.

    `auto` here is the table's default for every tower; `resolve_precision` adds the CPU's bf16.
    """
    kind = device.partition(':')[0]
    default, accepted = PRECISIONS[backend][kind]
    asked = _asked(dtype)
    if asked in ('', 'auto'):
        return default
    if asked not in accepted:
        why = _WHY_NOT.get((backend, kind, asked), f'the {backend} backend runs {" or ".join(accepted)} on {kind}')
        raise BackendUnavailableError(
            f'dtype {dtype!r} is not available: {why}; use one of '
            f'{", ".join(repr(a) for a in accepted)} (or "auto": {_auto_words(backend, kind)})'
        )
    return asked


def resolve_precision(
    backend: str, device: str, dtype: str | None, native_bf16: tuple[bool, str] | None = None
) -> Precision:
    """Each tower's precision for `backend` on `device` when `dtype` was asked for, with the reason.

    `native_bf16` is `cpu_bf16()`'s answer (passed in by tests); it is read only for `auto` on a CPU.
    """
    kind = device.partition(':')[0]
    asked = _asked(dtype)
    single = resolve_dtype(backend, device, dtype)
    if asked not in ('', 'auto'):
        return Precision(single, single, f'dtype {asked} was asked for')
    if kind != 'cpu':
        return Precision(single, single, f'auto: {single} on {kind}')
    if backend not in CPU_BF16_AUTO:
        return Precision(single, single, f'auto: {single} on CPUs for the {backend} backend')
    native, why = native_bf16 if native_bf16 is not None else cpu_bf16()
    if not native:
        return Precision('fp32', 'fp32', f'auto: fp32, {why}')
    images, texts = CPU_BF16_AUTO[backend]
    if images == texts:
        return Precision(images, texts, f'auto: {why}')
    return Precision(images, texts, f'auto: {why}; {texts} texts')


@lru_cache(maxsize=1)
def cpu_bf16() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively, and the evidence, from its flags (never from its model name)."""
    features = cpu_features()
    return detect_cpu_bf16(os.environ, set(features.flags) if features.readable else None)


def detect_cpu_bf16(environ, flags: set[str] | None) -> tuple[bool, str]:
    forced = str(environ.get(CPU_BF16_ENV, '')).strip().lower()
    if forced in ('1', 'true', 'yes', 'on'):
        return True, f'native bf16 forced on by {CPU_BF16_ENV}'
    if forced in ('0', 'false', 'no', 'off'):
        return False, f'native bf16 forced off by {CPU_BF16_ENV}'
    if flags is None:
        return False, f'the CPU flags could not be read ({cpu_features().machine or "unknown machine"})'
    found = [f for f in BF16_FLAGS if f in flags]
    if found:
        return True, f'this CPU computes bf16 natively ({", ".join(found)})'
    return False, f'this CPU has no native bf16 ({" / ".join(BF16_FLAGS)} absent)'


def _asked(dtype: str | None) -> str:
    return str(dtype).strip().lower() if dtype is not None else ''


def _auto_words(backend: str, kind: str) -> str:
    default = PRECISIONS[backend][kind][0]
    if kind == 'cpu' and backend in CPU_BF16_AUTO:
        images, texts = CPU_BF16_AUTO[backend]
        return f'{images} images and {texts} texts where the CPU computes bf16 natively, else {default}'
    return default
