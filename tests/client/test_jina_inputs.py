"""What clipserve_client.jina accepts and how it reads it, without a server."""

import io
import time

import numpy as np
import pytest
from docarray import Document
from PIL import Image

from clipserve_client.images import array_to_png
from clipserve_client.jina import Client, FetchError
from clipserve_client.jina.address import parse_address
from clipserve_client.jina.inputs import Loader, to_content_document
from tests.integration.conftest import data_uri, make_image


def test_addresses():
    assert parse_address('grpcs://example.com').port == 443
    address = parse_address('ws://127.0.0.1:5')
    assert (address.protocol, address.tls, str(address)) == ('websocket', False, 'ws://127.0.0.1:5')
    assert parse_address('https://[::1]:8443').url('/post') == 'https://[::1]:8443/post'
    for bad in ('ftp://host:1', 'grpc://host', 'http://host:1/path', '127.0.0.1:51000'):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_ca_file_needs_tls_and_must_exist(tmp_path):
    with pytest.raises(ValueError, match='TLS'):
        Client('grpc://127.0.0.1:1', ca_file=tmp_path / 'ca.pem')
    with pytest.raises(FileNotFoundError):
        Client('grpcs://127.0.0.1:1', ca_file=tmp_path / 'missing.pem')


@pytest.mark.parametrize(
    'content', ['one string', b'bytes', Document(text='x'), {'text': 'x'}, 42, np.zeros((4, 4, 3), np.uint8)]
)
def test_a_single_input_instead_of_a_list_is_a_type_error(content):
    with pytest.raises(TypeError):
        Client('grpc://127.0.0.1:1').encode(content)


@pytest.mark.parametrize('value', [{'a': 1}, 3.5, None, object(), [1, 2]])
def test_unsupported_inputs_name_their_position(value):
    with pytest.raises(TypeError, match=r'input 7: cannot send'):
        to_content_document(value, Loader(), 7)


def test_text_and_image_strings(tmp_path):
    loader = Loader()
    assert to_content_document('a photo of a dog', loader, 0).text == 'a photo of a dog'
    png = make_image()
    assert to_content_document(data_uri(png), loader, 0).blob == png
    with pytest.raises(FetchError, match='no such file.*Document\\(text='):
        to_content_document('apple.png', loader, 0)
    with pytest.raises(ValueError, match='empty string'):
        to_content_document('', loader, 0)
    with pytest.raises(TypeError, match='no text, blob, tensor or uri'):
        to_content_document(Document(), loader, 0)


def test_arrays_follow_the_servers_tensor_rule():
    pixels = np.random.default_rng(0).integers(0, 256, (5, 6, 3), dtype=np.uint8)

    def decoded(array):
        return np.asarray(Image.open(io.BytesIO(array_to_png(array))))

    np.testing.assert_array_equal(decoded(pixels), pixels)
    np.testing.assert_array_equal(decoded(pixels / 255.0), pixels)  # floats in [0, 1] are scaled
    np.testing.assert_array_equal(decoded(np.dstack([pixels, pixels[:, :, :1]])), pixels)  # alpha dropped
    np.testing.assert_array_equal(decoded(pixels[:, :, 0]), pixels[:, :, 0])  # grayscale HxW
    for bad in (np.zeros((5, 6, 2)), np.zeros((5,)), np.zeros((0, 4, 3))):
        with pytest.raises(ValueError, match='HxW'):
            array_to_png(bad)
    with pytest.raises(ValueError, match='NaN'):
        array_to_png(np.full((2, 2), np.nan))


def test_urls_are_fetched_with_a_timeout_and_a_size_cap(image_server):
    loader = Loader(fetch_timeout=0.5, max_bytes=30_000)
    doc = to_content_document(f'{image_server}/ok.png', loader, 0)
    assert doc.blob == make_image() and doc.uri.endswith('/ok.png')
    assert to_content_document(Document(uri=f'{image_server}/ok.png'), loader, 0).blob == make_image()
    with pytest.raises(FetchError, match='limit of 30000'):
        to_content_document(f'{image_server}/big.png', loader, 0)
    with pytest.raises(FetchError, match='HTTP 404'):
        to_content_document(f'{image_server}/missing.png', loader, 0)
    started = time.monotonic()
    with pytest.raises(FetchError, match='input 3: .*slow.png'):
        to_content_document(f'{image_server}/slow.png', loader, 3)
    assert time.monotonic() - started < 10  # cut by the 0.5 s timeout, not after the server's 30 s
