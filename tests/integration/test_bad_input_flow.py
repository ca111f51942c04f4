"""Bad input through a real Flow: a clear error naming the document and the reason, and the Flow keeps serving."""

import numpy as np
import pytest
from docarray import Document, DocumentArray
from jina import Client
from jina.excepts import BadServer

from .conftest import data_uri, make_image


def post(ports, docs, parameters=None):
    return Client(host='127.0.0.1', port=ports['grpc']).post('/', docs, parameters=parameters or {})


def assert_still_serving(ports):
    out = post(ports, DocumentArray([Document(text='still alive'), Document(blob=make_image())]))
    assert all(d.embedding is not None for d in out)


def expect_error(ports, docs, *fragments, parameters=None):
    with pytest.raises(BadServer) as err:
        post(ports, docs, parameters)
    message = str(err.value)
    for fragment in fragments:
        assert fragment.lower() in message.lower(), message
    assert_still_serving(ports)
    return message


@pytest.mark.parametrize(
    'blob, reason',
    [
        (b'definitely not an image', 'decode'),
        (make_image(fmt='JPEG')[:200], 'truncated'),
    ],
)
def test_undecodable_image(tiny_flow, blob, reason):
    docs = DocumentArray([Document(id='good', text='fine'), Document(id='broken-1', blob=blob)])
    message = expect_error(tiny_flow, docs, 'broken-1', reason)
    assert "'good'" not in message


def test_every_bad_document_is_named(tiny_flow):
    docs = DocumentArray(
        [Document(id=f'bad-{i}', blob=b'xx') for i in range(3)] + [Document(id='ok', blob=make_image())]
    )
    expect_error(tiny_flow, docs, 'bad-0', 'bad-1', 'bad-2', '3 document(s)')


def test_too_many_pixels(tiny_flow):
    expect_error(tiny_flow, DocumentArray([Document(id='huge', blob=make_image(2500, 2000))]), 'huge', '4000000')


def test_extreme_aspect_ratio(tiny_flow):
    expect_error(tiny_flow, DocumentArray([Document(id='wide', blob=make_image(20000, 1))]), 'wide', 'aspect')


def test_bad_tensor(tiny_flow):
    docs = DocumentArray([Document(id='nan', tensor=np.full((8, 8, 3), np.nan, dtype=np.float32))])
    expect_error(tiny_flow, docs, 'nan')
    expect_error(tiny_flow, DocumentArray([Document(id='rank5', tensor=np.zeros((2, 2, 2, 2, 2)))]), 'rank5')


@pytest.mark.parametrize(
    'uri, reason',
    [
        ('/etc/passwd', 'allow_local_files'),
        ('file:///etc/passwd', 'allow_local_files'),
        ('http://example.com/cat.jpg', 'allow_remote_uris'),
        ('data:image/png;base64,!!!', 'base64'),
    ],
)
def test_disallowed_or_malformed_uri(tiny_flow, uri, reason):
    expect_error(tiny_flow, DocumentArray([Document(id='u1', uri=uri)]), 'u1', reason)


def test_data_uri_that_is_not_an_image(tiny_flow):
    expect_error(tiny_flow, DocumentArray([Document(id='txt', uri=data_uri(b'hello', 'text/plain'))]), 'txt')


@pytest.mark.parametrize(
    'parameters, name',
    [
        ({'drop_image_content': 'yes'}, 'drop_image_content'),
        ({'access_paths': 7}, 'access_paths'),
    ],
)
def test_known_parameter_with_wrong_type(tiny_flow, parameters, name):
    expect_error(tiny_flow, DocumentArray([Document(text='x')]), name, parameters=parameters)


def test_unknown_parameters_are_ignored(tiny_flow):
    out = post(tiny_flow, DocumentArray([Document(text='x')]), {'limit': 10, 'something_else': {'a': 1}})
    assert out[0].embedding is not None


def test_blob_over_the_byte_cap(tiny_flow):
    """max_image_bytes (default 20 MiB) holds for blobs, what both clients send, as for data URIs and files."""
    oversized = make_image() + b'\0' * (20 * 1024 * 1024)  # a valid PNG with trailing bytes: decodable if read
    docs = DocumentArray([Document(id='ok', blob=make_image()), Document(id='big-blob', blob=oversized)])
    message = expect_error(tiny_flow, docs, 'big-blob', 'over the limit of 20971520 bytes', 'max_image_bytes')
    assert "'ok'" not in message


def test_tensor_over_the_pixel_cap(tiny_flow):
    docs = DocumentArray([Document(id='big-tensor', tensor=np.zeros((2001, 2000, 3), dtype=np.uint8))])
    expect_error(tiny_flow, docs, 'big-tensor', '4000000')
