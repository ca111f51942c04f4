"""One precision table for every backend: the same 'auto', the same errors."""

import pytest

from clipserve.backends.cpu_features import combine, cpu_features, read_cpuinfo_flags
from clipserve.backends.precision import (
    CPU_BF16_ENV,
    PRECISIONS,
    detect_cpu_bf16,
    resolve_dtype,
    resolve_precision,
)
from clipserve.errors import BackendUnavailableError

pytestmark = pytest.mark.precision


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
        ('torch', 'cpu', 'int8', 'int8 runs on the onnx and openvino backends'),
        ('onnx', 'cuda', 'int8', 'int8 ONNX copies run on CPUs'),
    ],
)
def test_anything_else_is_a_clear_error(backend, device, dtype, words):
    with pytest.raises(BackendUnavailableError, match=words):
        resolve_dtype(backend, device, dtype)


NATIVE = (True, 'this CPU computes bf16 natively (avx512_bf16)')
NOT_NATIVE = (False, 'this CPU has no native bf16 (amx_bf16 / avx512_bf16 absent)')


@pytest.mark.parametrize('asked', [None, '', 'auto'])
def test_auto_on_a_cpu_with_native_bf16_runs_both_torch_towers_in_bf16(asked):
    precision = resolve_precision('torch', 'cpu', asked, native_bf16=NATIVE)
    assert (precision.images, precision.texts, precision.name) == ('bf16', 'bf16', 'bf16')
    assert 'avx512_bf16' in precision.reason


def test_auto_on_a_cpu_without_native_bf16_is_fp32_for_both_towers():
    precision = resolve_precision('torch', 'cpu', 'auto', native_bf16=NOT_NATIVE)
    assert (precision.images, precision.texts, precision.name) == ('fp32', 'fp32', 'fp32')
    assert 'no native bf16' in precision.reason


def test_an_asked_precision_wins_over_the_cpu_and_says_so():
    for dtype in ('fp32', 'bf16'):
        precision = resolve_precision('torch', 'cpu', dtype, native_bf16=NATIVE)
        assert (precision.images, precision.texts) == (dtype, dtype)
        assert precision.reason == f'dtype {dtype} was asked for'


def test_backends_without_a_cpu_bf16_rule_keep_fp32_on_any_cpu():
    assert resolve_precision('onnx', 'cpu', None, native_bf16=NATIVE).name == 'fp32'
    assert resolve_precision('torch', 'cuda:0', None, native_bf16=NATIVE).name == 'fp16'


def test_onnx_bf16_on_a_cpu_is_refused_with_the_alternatives():
    with pytest.raises(BackendUnavailableError, match='int8'):
        resolve_precision('onnx', 'cpu', 'bf16')


@pytest.mark.parametrize(
    'flags, expected',
    [
        ({'avx2', 'fma'}, False),
        ({'avx512f', 'avx512_vnni'}, False),  # VNNI is int8, not bf16
        ({'avx512f', 'avx512_bf16'}, True),
        ({'amx_tile', 'amx_bf16'}, True),
        (None, False),  # flags unreadable (not Linux): never guess
    ],
)
def test_detection_reads_the_cpu_flags(flags, expected):
    native, why = detect_cpu_bf16({}, flags)
    assert native is expected and why


def test_detection_can_be_forced_either_way():
    assert detect_cpu_bf16({CPU_BF16_ENV: '1'}, {'avx2'})[0] is True
    assert detect_cpu_bf16({CPU_BF16_ENV: '0'}, {'avx512_bf16'})[0] is False
    assert 'forced off' in detect_cpu_bf16({CPU_BF16_ENV: '0'}, {'avx512_bf16'})[1]


def test_this_machines_features_come_from_cpuid_and_agree_with_the_bf16_choice():
    features = cpu_features()
    assert features.readable and features.kind != 'unknown'
    native, _ = detect_cpu_bf16({}, set(features.flags))
    assert native == bool(features.native_bf16)
    cpuinfo = read_cpuinfo_flags()
    if cpuinfo is not None and 'avx2' in cpuinfo and 'avx2' not in features.flags:
        assert 'avx512f' not in features.flags  # an emulated older CPU: CPUID wins over the host's cpuinfo


@pytest.mark.parametrize(
    'cpuid, cpuinfo, kind, bf16',
    [
        ({'avx2', 'fma'}, {'avx2', 'fma'}, 'avx2', False),
        ({'avx2', 'fma', 'avx512f', 'avx512_vnni'}, None, 'avx512-vnni', False),
        ({'avx2', 'fma', 'avx512f', 'avx512_bf16'}, set(), 'avx512-bf16', True),
        ({'avx2', 'fma', 'avx512f'}, {'amx_bf16', 'amx_tile'}, 'avx512-bf16', True),  # AMX: only from cpuinfo
        # qemu -cpu Haswell on an AMX host: CPUID says AVX2, /proc/cpuinfo still the host's: no AMX, no bf16
        ({'avx2', 'fma'}, {'avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_bf16', 'avx_vnni'}, 'avx2', False),
        (None, None, 'unknown', False),
    ],
)
def test_features_trust_cpuid_and_take_from_cpuinfo_only_what_it_confirms(cpuid, cpuinfo, kind, bf16):
    features = combine(cpuid, cpuinfo, 'x86_64')
    assert features.kind == kind and bool(features.native_bf16) is bf16
    if kind == 'avx2':
        assert not features.int8_dot  # nor the host's AVX-VNNI: the emulated CPU has none
    assert kind in features.describe()
