"""Which precisions each backend computes on each kind of device, and the default: one table for all.

`None`, '' and 'auto' mean the default for the backend and device; anything the table does not list
for them is a clear error at start (never a silent change of precision).
"""

from __future__ import annotations

from clipserve.errors import BackendUnavailableError

DTYPES = ('fp32', 'fp16', 'bf16')  # what torch computes; onnx adds int8 on CPUs (a quantized copy)

# backend -> device kind -> (default, accepted)
PRECISIONS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    'torch': {'cpu': ('fp32', DTYPES), 'cuda': ('fp16', DTYPES), 'mps': ('fp16', DTYPES)},
    'onnx': {'cpu': ('fp32', ('fp32', 'int8')), 'cuda': ('fp16', ('fp32', 'fp16'))},
    'tensorrt': {'cuda': ('fp16', ('fp32', 'fp16'))},
}

_WHY_NOT = {
    ('onnx', 'cpu', 'fp16'): 'fp16 ONNX models run on CUDA only',
    ('tensorrt', 'cuda', 'bf16'): 'the tensorrt backend builds fp16 or fp32 engines',
    ('torch', 'cpu', 'int8'): "int8 is the onnx backend's (a dynamically quantized copy of the export)",
    ('onnx', 'cuda', 'int8'): 'int8 ONNX copies run on CPUs (dynamic quantization); use fp16 on CUDA',
}


def resolve_dtype(backend: str, device: str, dtype: str | None) -> str:
    """The precision `backend` runs on `device` ('cpu', 'cuda', 'cuda:1', ...) for the asked `dtype`."""
    kind = device.partition(':')[0]
    default, accepted = PRECISIONS[backend][kind]
    asked = str(dtype).strip().lower() if dtype is not None else ''
    if asked in ('', 'auto'):
        return default
    if asked not in accepted:
        why = _WHY_NOT.get((backend, kind, asked), f'the {backend} backend runs {" or ".join(accepted)} on {kind}')
        raise BackendUnavailableError(
            f'dtype {dtype!r} is not available: {why}; use one of '
            f'{", ".join(repr(a) for a in accepted)} (or "auto": {default})'
        )
    return asked
