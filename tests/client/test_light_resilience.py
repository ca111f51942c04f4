"""The light client's retries, backoff, Retry-After, timeouts, token header and async concurrency limit.

Against fake_openai.FakeAPI, a scripted stand-in for /v1/embeddings (why: a real Flow cannot answer 429,
503 or a dropped connection on cue); connection failures against a port where nothing listens. What the
real server answers (400, 401, 404, TLS) is tested against real Flows in test_light_flows.py.
"""

import asyncio
import re
import threading
import time

import numpy as np
import pytest

from clipserve_client import (
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    BadRequestError,
    Client,
    InternalServerError,
    RateLimitError,
    RequestTooLargeError,
)
from tests.integration.conftest import free_port

from .fake_openai import DROP, OK, FakeAPI, error

LIMIT = 'overloaded: 64 requests in flight on this replica, its limit (max_requests=64); retry after 1s'
OVERLOADED = error(429, LIMIT, 'overloaded', **{'Retry-After': '1'})


def lengths(out) -> list:
    return out[:, 0].astype(int).tolist()


def test_a_429_waits_as_long_as_retry_after_says():
    with FakeAPI([OVERLOADED]) as api:
        out = Client(api.url, backoff=0.01).encode(['abc', 'de'])
    assert lengths(out) == [3, 2]
    assert len(api.requests) == 2
    assert api.requests[1]['at'] - api.requests[0]['at'] >= 0.95  # Retry-After: 1, not the 10 ms backoff


def test_retries_exhausted_name_the_limits_and_keep_the_type():
    with FakeAPI([error(429, LIMIT, 'overloaded')] * 3) as api:  # no Retry-After: the backoff alone
        with pytest.raises(RateLimitError) as err:
            Client(api.url, retries=2, backoff=0.01).encode(['abc'])
    message = str(err.value)
    assert 'max_requests=64' in message and 'gave up after 3 attempt(s)' in message and 'retries=2' in message
    assert err.value.status == 429 and err.value.attempts == 3 and len(api.requests) == 3


@pytest.mark.parametrize('status', [502, 503, 504])
def test_5xx_that_say_try_again_are_retried(status):
    with FakeAPI([error(status, 'the encoder is not reachable (starting or stopping?); retry')] * 2) as api:
        out = Client(api.url, backoff=0.01).encode(['abcd'])
    assert lengths(out) == [4] and len(api.requests) == 3


@pytest.mark.parametrize(
    'answer, kind',
    [
        (error(400, 'input[0]: empty text'), BadRequestError),
        (error(413, 'the request body is larger than the limit of 100 bytes', 'too_large'), RequestTooLargeError),
        (error(500, 'internal error in the gateway', 'internal_error'), InternalServerError),
    ],
)
def test_other_errors_are_raised_at_once(answer, kind):
    with FakeAPI([answer]) as api:
        with pytest.raises(kind, match=re.escape(answer[2]['error']['message'])) as err:
            Client(api.url, backoff=0.01).encode(['abcd'])
    assert err.value.status == answer[0] and len(api.requests) == 1


def test_a_dropped_connection_is_retried():
    with FakeAPI([DROP]) as api:
        out = Client(api.url, backoff=0.01).encode(['abc'])
    assert lengths(out) == [3] and len(api.requests) == 2


def test_nothing_listening_is_a_connection_error_after_the_retries():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(APIConnectionError, match=r'gave up after 3 attempt\(s\).*retries=2') as err:
        Client(f'http://127.0.0.1:{port}', retries=2, backoff=0.05).encode(['abc'])
    assert f'127.0.0.1:{port}' in str(err.value) and isinstance(err.value, ConnectionError)
    assert time.monotonic() - started < 5


def test_a_server_that_comes_up_late_is_retried():
    port = free_port()
    api = FakeAPI(port=port)
    starter = threading.Timer(1.0, api.__enter__)
    starter.start()
    try:
        out = Client(api.url, retries=10, backoff=0.2).encode(['abc'])
        assert lengths(out) == [3]
    finally:
        starter.join()
        api.__exit__()


def test_a_slow_answer_is_a_timeout_error_and_not_retried():
    with FakeAPI(delay=6) as api:
        started = time.monotonic()
        with pytest.raises(APITimeoutError, match=r'no answer within 0.3 s') as err:
            Client(api.url, timeout=0.3, backoff=0.01).encode(['abc'])
        # cut by the 0.3 s timeout, well before the 6 s answer (a bound a loaded machine cannot race)
        assert time.monotonic() - started < 4 and isinstance(err.value, TimeoutError)
        api.release.set()  # the handler answers now, into a closed connection
        assert api.wait_idle()
    assert len(api.requests) == 1  # not sent again


def test_the_token_header_from_the_argument_or_the_environment(monkeypatch):
    with FakeAPI() as api:
        Client(api.url, token='secret').encode(['a'])
        monkeypatch.setenv('CLIPSERVE_AUTH_TOKEN', 'from-env')
        Client(api.url).encode(['a'])
        monkeypatch.delenv('CLIPSERVE_AUTH_TOKEN')
        Client(api.url).encode(['a'])
    sent = [request['headers'].get('Authorization') for request in api.requests]
    assert sent == ['Bearer secret', 'Bearer from-env', None]
    assert api.requests[0]['body']['encoding_format'] == 'base64'
    assert api.requests[0]['headers']['User-Agent'].startswith('clipserve-client/')


def test_the_async_client_holds_at_most_max_concurrency_requests_and_keeps_the_order():
    """Two calls of 15 and 2 requests (0.3 s each) through one client of max_concurrency=3: three at once,
    never more (a bound on time would be flaky on a loaded machine; the server's count is not)."""
    texts = ['x' * (i + 1) for i in range(30)]
    with FakeAPI(delay=0.3) as api:

        async def main():
            async with AsyncClient(api.url, max_concurrency=3, batch_size=2) as client:
                return await asyncio.gather(client.encode(texts), client.encode(texts[:4]))

        out, second = asyncio.run(main())
    assert lengths(out) == list(range(1, 31)) and lengths(second) == [1, 2, 3, 4]
    assert api.most_in_flight == 3 and len(api.requests) == 17


def test_the_async_client_retries_too():
    with FakeAPI([OVERLOADED, DROP]) as api:

        async def main():
            async with AsyncClient(api.url, backoff=0.01) as client:
                return await client.encode(['abc', 'de'])

        out = asyncio.run(main())
    assert lengths(out) == [3, 2] and len(api.requests) == 3


def test_a_failing_batch_stops_the_async_call_and_names_its_input():
    """The second request (inputs 2 and 3) is refused for its item 1: the error names input 3."""
    with FakeAPI([OK, error(400, 'input[1]: empty image data')]) as api:

        async def main():
            async with AsyncClient(api.url, max_concurrency=1, batch_size=2) as client:
                return await client.encode(['a', 'b', 'c', 'd', 'e', 'f'])

        with pytest.raises(BadRequestError, match=r'input\[3\]: empty image data'):
            asyncio.run(main())


def test_empty_input_sends_nothing():
    with FakeAPI() as api:
        out = Client(api.url).encode([])
    assert out.shape == (0, 0) and out.dtype == np.float32 and api.requests == []
