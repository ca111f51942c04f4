"""clipserve_client.jina: credentials, retries and timeouts, against a stand-in gateway that records what reaches it."""

import threading
import time

import numpy as np
import pytest

from clipserve_client.jina import Client, ServerError
from tests.integration.conftest import free_port

from .conftest import PROTOCOLS, url
from .fake_gateway import FakeGateway


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_credentials_reach_the_server(protocol):
    port = free_port()
    with FakeGateway(protocol, port) as gateway:
        out = Client(url(protocol, port), credential={'Authorization': 'secret'}).encode(['abc', 'abcdef'])
    np.testing.assert_array_equal(out[:, 0], [3, 6])
    assert gateway.authorizations and set(gateway.authorizations) == {'secret'}


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_credentials_from_the_environment(protocol, monkeypatch):
    monkeypatch.setenv('CLIP_AUTH_TOKEN', 'from-env')
    port = free_port()
    with FakeGateway(protocol, port) as gateway:
        Client(url(protocol, port)).encode(['abc'])
    assert set(gateway.authorizations) == {'from-env'}


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_nothing_listening_is_a_clear_error_after_the_retries(protocol):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r'gave up after 3 attempt') as err:
        Client(url(protocol, port), retries=2, backoff=0.05).encode(['abc'])
    assert f'127.0.0.1:{port}' in str(err.value)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_a_server_that_comes_up_late_is_retried(protocol):
    port = free_port()
    gateway = FakeGateway(protocol, port)
    starter = threading.Timer(1.0, gateway.start)
    starter.start()
    try:
        out = Client(url(protocol, port), retries=10, backoff=0.2).encode(['abc', 'de'], batch_size=1)
        np.testing.assert_array_equal(out[:, 0], [3, 2])
    finally:
        starter.join()
        gateway.stop()


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_transient_failures_during_a_call_are_retried(protocol):
    port = free_port()
    with FakeGateway(protocol, port, fail_first=2) as gateway:
        out = Client(url(protocol, port), retries=3, backoff=0.05).encode(
            ['a', 'bb', 'ccc', 'dddd'], batch_size=1, prefetch=2
        )
    np.testing.assert_array_equal(out[:, 0], [1, 2, 3, 4])
    assert gateway.failures_left == 0


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_timeout(protocol):
    port = free_port()
    with FakeGateway(protocol, port, delay=6):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r'encode\(\) did not finish within 0.3 s'):
            Client(url(protocol, port)).encode(['abc'], timeout=0.3)
        assert time.monotonic() - started < 4  # cut by the timeout, well before the 6 s answer
        with pytest.raises(TimeoutError):
            Client(url(protocol, port), timeout=0.3).encode(['abc'])  # the client's default
        assert len(Client(url(protocol, port), timeout=0.3).encode(['abc'], timeout=None)) == 1


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_an_overloaded_replica_is_retried_after_its_retry_after(protocol):
    """clipserve's replicas refuse what would pass their admission bound (OverloadedError with retry_after 0.3 s
    in its details; over HTTP with 429 too): sent again no sooner than the server asked."""
    port = free_port()
    with FakeGateway(protocol, port, overload_first=2) as gateway:
        out = Client(url(protocol, port), retries=3, backoff=0.01).encode(['abc'])
    np.testing.assert_array_equal(out[:, 0], [3])
    waits = np.diff(gateway.arrivals)
    assert len(gateway.arrivals) == 3 and waits.min() >= 0.28, waits


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_an_overload_that_outlasts_the_retries_is_a_server_error_naming_the_limit(protocol):
    port = free_port()
    with FakeGateway(protocol, port, overload_first=10) as gateway:
        with pytest.raises(ServerError, match=r'max_requests=1'):
            Client(url(protocol, port), retries=1, backoff=0.01).encode(['abc'])
        errors = []
        Client(url(protocol, port), retries=0).encode(['abc'], on_error=errors.append)
    assert len(gateway.arrivals) == 3 and errors[0].header.status.exception.name == 'OverloadedError'
