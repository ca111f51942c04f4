"""The light client without a server: what it accepts and sends, addresses, answers and errors as plain data."""

import base64
import io
import os
import subprocess
import sys
import time
from email.utils import formatdate

import numpy as np
import pytest
from PIL import Image

from clipserve_client import (
    AuthenticationError,
    BadRequestError,
    Client,
    FetchError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RequestTooLargeError,
    UnexpectedAnswerError,
)
from clipserve_client.connection import base_url
from clipserve_client.errors import APIStatusError, parse_retry_after, shift_items, status_error
from clipserve_client.images import array_to_png
from clipserve_client.inputs import Loader, prepare, to_item
from clipserve_client.retry import RetryPolicy
from clipserve_client.wire import read_embeddings, read_scores
from tests.integration.conftest import ROOT, data_uri, make_image


def image_of(item: dict) -> bytes:
    return base64.b64decode(item['image'])


# ---- inputs ---------------------------------------------------------------------------------


def test_strings_are_texts_unless_they_name_an_image(tmp_path):
    loader = Loader()
    assert to_item('a photo of a dog', 'input 0', loader) == {'text': 'a photo of a dog'}
    assert to_item('see http://x.org', 'input 0', loader) == {'text': 'see http://x.org'}
    png = make_image()
    assert to_item(data_uri(png), 'input 0', loader) == {'image': data_uri(png)}
    (tmp_path / 'dog.png').write_bytes(png)
    assert image_of(to_item(str(tmp_path / 'dog.png'), 'input 0', loader)) == png
    with pytest.raises(FetchError, match=r'input 4: .*no such file.*\{"text": \'apple.png\'\}'):
        to_item('apple.png', 'input 4', loader)
    with pytest.raises(ValueError, match='empty string'):
        to_item(' ', 'input 0', loader)


def test_explicit_items_bytes_and_paths(tmp_path):
    loader, png = Loader(), make_image()
    path = tmp_path / 'photo.jpg'  # the suffix does not matter for a Path: it is an image
    path.write_bytes(png)
    assert to_item({'text': 'apple.png'}, 'input 0', loader) == {'text': 'apple.png'}
    assert image_of(to_item({'image': png}, 'input 0', loader)) == png
    assert image_of(to_item(bytearray(png), 'input 0', loader)) == png
    assert image_of(to_item(path, 'input 0', loader)) == png
    with pytest.raises(FetchError, match='no such file$'):
        to_item(tmp_path / 'missing.png', 'input 0', loader)
    with pytest.raises(TypeError, match='exactly one key'):
        to_item({'text': 'a', 'image': png}, 'input 0', loader)
    with pytest.raises(ValueError, match='empty bytes'):
        to_item(b'', 'input 0', loader)


@pytest.mark.parametrize('value', [3.5, None, object(), [1, 2], {'texts': 'a'}])
def test_unsupported_inputs_name_their_position(value):
    with pytest.raises(TypeError, match=r'input 7: '):
        to_item(value, 'input 7', Loader())


def test_urls_are_fetched_or_passed_on(image_server):
    url = f'{image_server}/ok.png'
    assert image_of(to_item(url, 'input 0', Loader())) == make_image()
    assert to_item(url, 'input 0', Loader(fetch_urls=False)) == {'image': url}
    with pytest.raises(FetchError, match='input 2: .*HTTP 404'):
        to_item(f'{image_server}/missing.png', 'input 2', Loader())
    with pytest.raises(FetchError, match='limit of 30000'):
        to_item(f'{image_server}/big.png', 'input 0', Loader(max_bytes=30_000))
    items = prepare([url, 'a cat', url], 10, Loader())  # the batch's URLs in parallel, the order kept
    assert items[1] == {'text': 'a cat'} and image_of(items[0]) == image_of(items[2]) == make_image()


def test_arrays_are_lossless_pngs_following_the_servers_tensor_rule():
    pixels = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)

    def decoded(array):
        return np.asarray(Image.open(io.BytesIO(array_to_png(array))))

    np.testing.assert_array_equal(decoded(pixels), pixels)
    np.testing.assert_array_equal(decoded(pixels / 255.0), pixels)  # floats in [0, 1] are scaled
    np.testing.assert_array_equal(decoded(np.dstack([pixels, pixels[:, :, :1]])), pixels)  # alpha dropped
    np.testing.assert_array_equal(decoded(pixels[:, :, 0]), pixels[:, :, 0])  # grayscale HxW
    np.testing.assert_array_equal(decoded(pixels[:, :, :1]), pixels[:, :, 0])  # HxWx1
    wide = pixels.astype(np.int64) * 2 - 100  # integers outside 0..255 are clipped
    np.testing.assert_array_equal(decoded(wide), np.clip(wide, 0, 255))
    for bad in (np.zeros((5, 6, 2)), np.zeros((5,)), np.zeros((0, 4, 3))):
        with pytest.raises(ValueError, match='HxW'):
            array_to_png(bad)
    with pytest.raises(ValueError, match='NaN'):
        array_to_png(np.full((2, 2), np.nan))


@pytest.mark.parametrize('single', ['one string', b'bytes', {'text': 'x'}, 42, np.zeros((4, 4, 3), np.uint8)])
def test_a_single_input_instead_of_a_list_is_a_type_error(single):
    with pytest.raises(TypeError, match='encode'):
        Client('http://127.0.0.1:1').encode(single)


# ---- addresses and settings -----------------------------------------------------------------


def test_addresses():
    assert base_url('http://127.0.0.1:51001') == 'http://127.0.0.1:51001'
    assert base_url('https://clip.example.com/v1/') == 'https://clip.example.com'  # an OpenAI SDK base_url
    assert base_url('https://example.com/clip') == 'https://example.com/clip'  # behind a path prefix
    with pytest.raises(ValueError, match=r'clipserve_client\.jina'):
        base_url('grpc://127.0.0.1:51000')
    for bad in ('127.0.0.1:51001', 'ftp://host:1', 'http://', 'http://host:port', 'http://host:1/?q=1'):
        with pytest.raises(ValueError):
            base_url(bad)


def test_client_settings_are_checked_at_once(tmp_path):
    with pytest.raises(ValueError, match='TLS'):
        Client('http://127.0.0.1:1', ca_file=tmp_path / 'ca.pem')
    with pytest.raises(FileNotFoundError):
        Client('https://127.0.0.1:1', ca_file=tmp_path / 'missing.pem')
    with pytest.raises(ValueError, match='batch_size'):
        Client('http://127.0.0.1:1', batch_size=0)
    with pytest.raises(ValueError, match='retries'):
        Client('http://127.0.0.1:1', retries=-1)
    assert 'secret' not in repr(Client('http://127.0.0.1:1', token='secret')._settings)


# ---- answers and errors ---------------------------------------------------------------------


def _b64(values) -> str:
    return base64.b64encode(np.asarray(values, '<f4').tobytes()).decode()


def test_embeddings_are_put_in_the_order_sent_and_checked():
    answer = {'data': [{'index': 1, 'embedding': _b64([0, 1])}, {'index': 0, 'embedding': [1.0, 0.0]}]}
    np.testing.assert_array_equal(read_embeddings(answer, 2), [[1, 0], [0, 1]])
    assert read_embeddings(answer, 2).dtype == np.float32
    with pytest.raises(UnexpectedAnswerError, match='1 embeddings for 2 inputs'):
        read_embeddings({'data': answer['data'][:1]}, 2)
    with pytest.raises(UnexpectedAnswerError, match='bad index'):
        read_embeddings({'data': [answer['data'][0]] * 2}, 2)


def test_scores_are_put_in_document_order():
    answer = {
        'results': [{'index': 2, 'clip_score': 0.7}, {'index': 0, 'clip_score': 0.2}, {'index': 1, 'clip_score': 0.1}]
    }
    np.testing.assert_array_equal(read_scores(answer, 3, 'clip_score'), [0.2, 0.1, 0.7])
    with pytest.raises(ValueError, match="no 'siglip_score'"):
        read_scores(answer, 3, 'siglip_score')


@pytest.mark.parametrize(
    'status, kind',
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (404, NotFoundError),
        (413, RequestTooLargeError),
        (429, RateLimitError),
        (503, InternalServerError),
        (418, APIStatusError),
    ],
)
def test_statuses_become_error_types(status, kind):
    body = {'error': {'message': 'why', 'type': 'invalid_request_error', 'param': 'input[2]', 'code': 'c'}}
    made = status_error(status, body, {'retry-after': '3'}, url='http://h/v1/embeddings')
    assert type(made) is kind and (made.status, made.message, made.param, made.code) == (status, 'why', 'input[2]', 'c')
    assert str(made) == f'http://h/v1/embeddings: HTTP {status}: why' and made.retry_after == 3
    assert made.retryable == (status in (429, 503))


def test_non_openai_error_bodies_and_retry_after_dates():
    assert status_error(502, '<html>bad gateway</html>').message == '<html>bad gateway</html>'
    assert status_error(500, {'detail': 'boom'}).message == 'boom'
    assert parse_retry_after(None) is None and parse_retry_after('soon') is None
    assert 8 < parse_retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10


def test_item_positions_are_shifted_by_the_batchs_offset():
    made = status_error(400, {'error': {'message': 'input[0]: bad; input[12]: worse', 'param': 'input[0]'}})
    shifted = shift_items(made, 64)
    assert shifted.message == 'input[64]: bad; input[76]: worse' and shifted.param == 'input[64]'
    assert type(shifted) is BadRequestError


def test_retry_after_overrides_a_shorter_backoff_up_to_a_cap():
    policy = RetryPolicy(retries=3, backoff=0.1)
    assert 0.05 <= policy.delay(1) <= 0.1
    assert policy.delay(1, retry_after=2.5) == 2.5
    assert policy.delay(1, retry_after=3600) == 60
    assert policy.delay(20) <= 10  # max_backoff


def test_importing_and_making_a_client_loads_nothing_heavy():
    """The default install must not need them; this catches an import that would (the fresh-venv test is slow)."""
    code = (
        'import sys, clipserve_client; clipserve_client.Client("http://127.0.0.1:1"); '
        'clipserve_client.AsyncClient("http://127.0.0.1:1"); '
        'print(sorted({m.split(".")[0] for m in sys.modules} & {"jina", "docarray", "grpc", "pydantic", "torch", '
        '"PIL", "aiohttp", "clipserve"}))'
    )
    env = {**os.environ, 'PYTHONPATH': str(ROOT / 'client')}
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=60)
    assert result.stdout.strip() == '[]', result.stdout + result.stderr[-2000:]
