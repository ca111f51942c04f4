"""Device names are checked at start, the same way on every backend, with a message that says what to use."""

import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.devices import Device, check_index, parse_device
from clipserve.backends.torch.backend import pick_device
from clipserve.errors import BackendUnavailableError

from ..conftest import TINY


@pytest.mark.parametrize(
    'text, device',
    [
        (None, Device(None)),
        ('', Device(None)),
        ('auto', Device(None)),
        ('cpu', Device('cpu')),
        ('cuda', Device('cuda')),
        ('cuda:0', Device('cuda', 0)),
        ('CUDA:2', Device('cuda', 2)),
        (' cuda:1 ', Device('cuda', 1)),
    ],
)
def test_device_names(text, device):
    assert parse_device(text, 'onnx') == device


@pytest.mark.parametrize('text', ['cuda:x', 'cuda:', 'cuda:-1', 'cuda:1:2', 'gpu', 'cpu:0', 'mps', 'cuda 1', '0'])
def test_malformed_devices_are_refused(text):
    with pytest.raises(
        BackendUnavailableError, match='unknown device .* for the onnx backend; use "cpu", "cuda", "cuda:N"'
    ):
        parse_device(text, 'onnx')


def test_index_beyond_the_visible_gpus():
    check_index(Device('cuda', 0), 1, 'torch')
    with pytest.raises(
        BackendUnavailableError, match="'cuda:7' was asked for, but the torch backend sees 1 CUDA device.*cuda:0"
    ):
        check_index(Device('cuda', 7), 1, 'torch')


@pytest.mark.parametrize('backend', ['torch', 'onnx', 'tensorrt'])
def test_every_backend_refuses_a_malformed_device_before_loading(backend, tmp_path):
    with pytest.raises(BackendUnavailableError, match=f"unknown device 'cuda:x' for the {backend} backend"):
        create_backend(backend, TINY, BackendOptions(device='cuda:x'), model_path=None)


def test_torch_checks_the_index_against_its_gpus(monkeypatch):
    # This machine has no GPU: torch's own count is what the check reads, so set it as a one-GPU machine reports it.
    import torch

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    assert pick_device('cuda:0') == 'cuda:0' and pick_device('cuda') == 'cuda'
    with pytest.raises(BackendUnavailableError, match='sees 1 CUDA device'):
        pick_device('cuda:7')
