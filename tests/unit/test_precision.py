"""One precision table for every backend: the same 'auto', the same errors."""

import pytest

from clipserve.backends.precision import PRECISIONS, resolve_dtype
from clipserve.errors import BackendUnavailableError


@pytest.mark.parametrize(
    'backend, device, default',
    [
        ('torch', 'cpu', 'fp32'),
        ('torch', 'cuda:1', 'fp16'),
        ('onnx', 'cpu', 'fp32'),
        ('onnx', 'cuda', 'fp16'),
        ('tensorrt', 'cuda:0', 'fp16'),
    ],
)
def test_auto_and_unset_mean_the_default_on_every_backend(backend, device, default):
    for asked in (None, '', 'auto', 'AUTO'):
        assert resolve_dtype(backend, device, asked) == default


def test_every_listed_precision_is_accepted_as_written():
    for backend, devices in PRECISIONS.items():
        for kind, (_, accepted) in devices.items():
            for dtype in accepted:
                assert resolve_dtype(backend, kind, dtype) == dtype


@pytest.mark.parametrize(
    'backend, device, dtype, words',
    [
        ('onnx', 'cpu', 'fp16', 'fp16 ONNX models run on CUDA only'),
        ('onnx', 'cuda', 'bf16', 'onnx backend runs fp32 or fp16'),
        ('tensorrt', 'cuda', 'bf16', 'fp16 or fp32 engines'),
        ('torch', 'cpu', 'int4', "one of 'fp32', 'fp16', 'bf16'"),
        ('torch', 'cpu', 'int8', "int8 is the onnx backend's"),
        ('onnx', 'cuda', 'int8', 'int8 ONNX copies run on CPUs'),
    ],
)
def test_anything_else_is_a_clear_error(backend, device, dtype, words):
    with pytest.raises(BackendUnavailableError, match=words):
        resolve_dtype(backend, device, dtype)
