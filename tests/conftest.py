"""Shared fixtures. The tiny architecture keeps model-dependent tests fast; real ones use ViT-B-32::random."""

import os

import pytest

os.environ.setdefault('NO_VERSION_CHECK', '1')  # clip-client's PyPI check
os.environ.setdefault('JINA_LOG_LEVEL', 'WARNING')

TINY = 'clipserve-tiny::random'


@pytest.fixture(scope='session')
def tiny_backend():
    from clipserve.backends import BackendOptions, create_backend

    return create_backend('torch', TINY, BackendOptions(device='cpu'))
