"""Shared fixtures. The tiny architecture keeps model-dependent tests fast; real ones use ViT-B-32::random."""

import os

import pytest

os.environ.setdefault('NO_VERSION_CHECK', '1')  # clip-client's PyPI check
os.environ.setdefault('JINA_OPTOUT_TELEMETRY', '1')  # no calls home from test Flows
os.environ.setdefault('JINA_LOG_LEVEL', 'WARNING')
# Tests run torch in this process and then start Flows; forking after OpenMP has started can hang
# the child (libgomp is not fork-safe), so executors start in fresh interpreters.
os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')

TINY = 'clipserve-tiny::random'


@pytest.fixture(scope='session')
def tiny_backend():
    from clipserve.backends import BackendOptions, create_backend

    return create_backend('torch', TINY, BackendOptions(device='cpu'))
