"""Fixtures of the TensorRT tests: a cache folder, the tiny model's ONNX export, a stand-in TensorRT."""

import sys

import pytest

from clipserve.backends.tensorrt import backend as trb

from ...conftest import TINY
from .fakes import FakeCudart, FakeTRT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    return tmp_path / 'cache'


@pytest.fixture(scope='module')
def tiny_export(tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    out = tmp_path_factory.mktemp('tiny-onnx-for-trt')
    export_onnx(TINY, out)
    return out


@pytest.fixture
def fake_trt(monkeypatch, cache):
    fake, cudart = FakeTRT(), FakeCudart()
    monkeypatch.setitem(sys.modules, 'tensorrt', fake)
    monkeypatch.setattr(trb, 'import_cudart', lambda: cudart)
    fake.cudart = cudart
    return fake
