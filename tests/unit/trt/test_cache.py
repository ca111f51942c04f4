"""The TensorRT engines' cache without TensorRT: shape profiles, cache keys and paths, stale and corrupt
engines rebuilt, and one build at a time across processes."""

import dataclasses
import json
import subprocess
import sys

import pytest

from clipserve.backends.tensorrt import profiles as tensorrt_profiles
from clipserve.backends.tensorrt.cache import (
    EngineKey,
    engine_path,
    load_or_build,
    onnx_sha256,
    sidecar_path,
    stale_reason,
    timing_cache_path,
    write_engine,
)
from clipserve.backends.tensorrt.profiles import (
    ShapeProfile,
    image_profiles,
    profile_signature,
    text_profiles,
)
from clipserve.errors import EngineBuildError, InvalidParameterError

KEY = EngineKey(
    tower='visual',
    onnx_sha256='a' * 64,
    tensorrt_version='10.3.0',
    gpu_name='NVIDIA H200',
    compute_capability='9.0',
    precision='fp16',
    profile='pixel_values=1x3x224x224/32x3x224x224/32x3x224x224',
)


# ---- profiles ---------------------------------------------------------------------------------


def test_image_profile():
    (p,) = image_profiles(32, 224)
    assert p == ShapeProfile('pixel_values', (1, 3, 224, 224), (32, 3, 224, 224), (32, 3, 224, 224))
    (p,) = image_profiles(1, 336)
    assert p.min == p.opt == p.max == (1, 3, 336, 336)


def test_text_profile_dynamic_and_static():
    ids, mask = text_profiles(64, 77, dynamic_sequence=True)
    assert (ids.name, mask.name) == ('input_ids', 'attention_mask')
    assert ids.min == (1, 1) and ids.opt == (64, tensorrt_profiles.OPT_TEXT_LENGTH) and ids.max == (64, 77)
    assert (mask.min, mask.opt, mask.max) == (ids.min, ids.opt, ids.max)
    (ids,) = text_profiles(8, 77, dynamic_sequence=False, names=('input_ids',))
    assert ids.min == (1, 77) and ids.opt == (8, 77) and ids.max == (8, 77)
    (short,) = text_profiles(4, 8, dynamic_sequence=True, names=('input_ids',))
    assert short.opt == (4, 8)  # opt never exceeds the context


@pytest.mark.parametrize('bad', [0, -1, 2.5, True, '32'])
def test_max_batch_must_be_positive_int(bad):
    with pytest.raises(InvalidParameterError):
        image_profiles(bad, 224)


def test_profile_signature_is_canonical_and_sensitive():
    a = text_profiles(32, 77, True)
    assert profile_signature(a) == profile_signature(tuple(reversed(a)))
    assert profile_signature(a) != profile_signature(text_profiles(64, 77, True))
    assert profile_signature(a) != profile_signature(text_profiles(32, 77, False))
    assert profile_signature(image_profiles(32, 224)) == 'pixel_values=1x3x224x224/32x3x224x224/32x3x224x224'


# ---- cache keys and paths ---------------------------------------------------------------------


@pytest.mark.parametrize('field', [f.name for f in dataclasses.fields(EngineKey)])
def test_engine_key_changes_with_every_component(field):
    value = getattr(KEY, field)
    other = dataclasses.replace(KEY, **{field: value + 1 if isinstance(value, int) else value + '-other'})
    assert other.digest() != KEY.digest() and engine_path(other) != engine_path(KEY)


def test_engine_key_is_stable(cache):
    assert dataclasses.replace(KEY).digest() == KEY.digest()
    path = engine_path(KEY)
    assert path.parent == cache / 'tensorrt' and path.name.startswith('visual-fp16-') and path.suffix == '.engine'
    assert sidecar_path(path) == path.with_suffix('.json')


def test_timing_cache_per_gpu_and_version(cache):
    base = timing_cache_path('10.3.0', 'NVIDIA H200', '9.0')
    assert base.parent == cache / 'tensorrt' and ' ' not in base.name
    assert base != timing_cache_path('10.4.0', 'NVIDIA H200', '9.0')
    assert base != timing_cache_path('10.3.0', 'NVIDIA A100-SXM4-80GB', '8.0')
    assert base != timing_cache_path('10.3.0', 'NVIDIA H200', '9.1')


def test_onnx_hash_covers_graph_and_external_data(tmp_path):
    graph = tmp_path / 'visual.onnx'
    graph.write_bytes(b'graph')
    plain = onnx_sha256(graph)
    (tmp_path / 'visual.onnx.data').write_bytes(b'weights')
    with_data = onnx_sha256(graph)
    (tmp_path / 'visual.onnx.data').write_bytes(b'weightz')
    assert len({plain, with_data, onnx_sha256(graph)}) == 3
    graph.write_bytes(b'graph2')
    assert onnx_sha256(graph) not in {plain, with_data}


# ---- stale and corrupt engines ----------------------------------------------------------------


def test_fresh_engine_is_loadable(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    assert stale_reason(engine, KEY) is None
    assert json.loads(sidecar_path(engine).read_text())['key'] == KEY.as_dict()


def test_missing_engine_or_sidecar(tmp_path):
    engine = engine_path(KEY, tmp_path)
    assert stale_reason(engine, KEY) == 'no cached engine'
    engine.write_bytes(b'plan-bytes')
    assert 'missing' in stale_reason(engine, KEY)


@pytest.mark.parametrize(
    'sidecar', ['{not json', '[]', '{"key": {}}', '{"key": {}, "engine_bytes": "x", "engine_sha256": 1}']
)
def test_unreadable_sidecar(tmp_path, sidecar):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    sidecar_path(engine).write_text(sidecar)
    assert stale_reason(engine, KEY) is not None


@pytest.mark.parametrize(
    'field,value',
    [
        ('tensorrt_version', '10.4.0'),
        ('gpu_name', 'NVIDIA A100'),
        ('compute_capability', '8.0'),
        ('precision', 'fp32'),
        ('onnx_sha256', 'b' * 64),
    ],
)
def test_key_mismatch_names_what_changed(tmp_path, field, value):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, dataclasses.replace(KEY, **{field: value}), b'plan-bytes')  # e.g. copied from another machine
    reason = stale_reason(engine, KEY)
    assert field in reason and value in reason


def test_truncated_and_corrupt_engines(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    engine.write_bytes(b'plan')
    assert 'truncated' in stale_reason(engine, KEY)
    engine.write_bytes(b'plan-bytez')  # same size, other bytes
    assert 'sha256' in stale_reason(engine, KEY)


def test_load_or_build_uses_a_fresh_cache(tmp_path):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'plan-bytes')
    built = []
    result = load_or_build(engine, KEY, lambda blob: ('engine', blob), lambda: built.append(1) or b'new')
    assert result == (('engine', b'plan-bytes'), None) and not built


@pytest.mark.parametrize('deserialize_old', [lambda blob: None, lambda blob: 1 / 0])
def test_load_or_build_rebuilds_what_tensorrt_rejects(tmp_path, deserialize_old):
    engine = engine_path(KEY, tmp_path)
    write_engine(engine, KEY, b'old-plan')

    def deserialize(blob):
        return deserialize_old(blob) if blob == b'old-plan' else ('engine', blob)

    result, reason = load_or_build(engine, KEY, deserialize, lambda: b'new-plan')
    assert result == ('engine', b'new-plan') and 'deserialize' in reason
    assert engine.read_bytes() == b'new-plan' and stale_reason(engine, KEY) is None


def test_load_or_build_rebuilds_stale_and_fails_loudly(tmp_path):
    engine = engine_path(KEY, tmp_path)
    engine.parent.mkdir(parents=True, exist_ok=True)
    engine.write_bytes(b'no sidecar')
    result, reason = load_or_build(engine, KEY, lambda blob: blob, lambda: b'plan')
    assert result == b'plan' and 'missing' in reason
    (tmp_path / 'x').mkdir()
    with pytest.raises(EngineBuildError, match='could not deserialize'):
        load_or_build(engine_path(KEY, tmp_path / 'x'), KEY, lambda blob: None, lambda: b'plan')


def test_replicas_starting_together_build_one_engine(tmp_path):
    """Two processes ask for the same engine at once: one builds it under the lock, the other then loads it."""
    engine, gate = engine_path(KEY, tmp_path), tmp_path / 'go'
    script = (
        'import os, sys, time\n'
        'from pathlib import Path\n'
        'from clipserve.backends.tensorrt.cache import EngineKey, load_or_build\n'
        'print("ready", flush=True)\n'
        f'while not os.path.exists({str(gate)!r}): time.sleep(0.005)\n'
        'def build():\n'
        '    print("building", flush=True)\n'
        '    time.sleep(1)\n'
        '    return b"plan"\n'
        f'engine, why = load_or_build(Path({str(engine)!r}), EngineKey(**{KEY.as_dict()!r}), lambda b: b, build)\n'
        'print("built" if why else "loaded")\n'
    )
    processes = [subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert [p.stdout.readline().strip() for p in processes] == ['ready', 'ready']  # both imported, at the gate
    gate.touch()
    outputs = sorted(p.communicate(timeout=120)[0].split() for p in processes)
    assert all(p.returncode == 0 for p in processes)
    assert outputs == [['building', 'built'], ['loaded']], outputs
