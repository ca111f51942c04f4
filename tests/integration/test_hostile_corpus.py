"""The bad-input corpus through a real Flow (generated here, nothing downloaded).

Each bad case must get a clear per-document error and leave the Flow serving; each odd-but-valid
case must encode. Runs against the session's tiny Flow (max_image_pixels 4,000,000).
"""

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from docarray import Document, DocumentArray
from jina import Client
from jina.excepts import BadServer
from PIL import Image

from .conftest import make_image


def encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def rgb(width=40, height=30, seed=0):
    return Image.open(io.BytesIO(make_image(width, height, seed=seed)))


def png_bomb(width=100_000, height=100_000) -> bytes:
    """A ~100-byte PNG whose header declares 10 gigapixels."""

    def chunk(kind, data):
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

    header = struct.pack('>IIBBBBB', width, height, 1, 0, 0, 0, 0)
    return (
        b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(b'\0' * 64)) + chunk(b'IEND', b'')
    )


def animated_gif() -> bytes:
    frames = [Image.new('P', (20, 20), color=i) for i in (10, 200)]
    return encoded(frames[0], 'GIF', save_all=True, append_images=frames[1:], duration=50, loop=0)


def exif_rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return encoded(rgb(60, 20), 'JPEG', exif=exif.tobytes())


VALID = {
    '1x1': lambda: encoded(Image.new('RGB', (1, 1), (200, 10, 10)), 'PNG'),
    '16-bit': lambda: encoded(Image.fromarray(np.arange(600, dtype=np.uint16).reshape(20, 30) * 100), 'PNG'),
    'CMYK JPEG': lambda: encoded(rgb().convert('CMYK'), 'JPEG'),
    'palette with transparency': lambda: encoded(rgb().convert('P'), 'PNG', transparency=0),
    'animated GIF': animated_gif,
    'EXIF-rotated JPEG': exif_rotated_jpeg,
    'WebP': lambda: encoded(rgb(), 'WEBP'),
    'grayscale': lambda: encoded(rgb().convert('L'), 'PNG'),
}

INVALID = {
    'truncated JPEG': lambda: encoded(rgb(400, 300), 'JPEG')[:300],
    'truncated PNG': lambda: encoded(rgb(400, 300), 'PNG')[:300],
    'truncated GIF': lambda: animated_gif()[:40],
    'truncated WebP': lambda: encoded(rgb(400, 300), 'WEBP')[:60],
    'corrupt bytes': lambda: bytes(range(256)) * 4,
    'decompression bomb': png_bomb,
    '20000x1': lambda: encoded(Image.new('RGB', (20000, 1)), 'PNG'),
}


def client(ports):
    return Client(host='127.0.0.1', port=ports['grpc'])


def assert_serving(ports):
    out = client(ports).post('/', DocumentArray([Document(text='still serving'), Document(blob=make_image())]))
    assert all(d.embedding is not None for d in out)


@pytest.mark.parametrize('case', list(VALID))
def test_odd_but_valid_images_encode(tiny_flow, case):
    out = client(tiny_flow).post('/', DocumentArray([Document(id=case, blob=VALID[case]())]))
    assert out[0].embedding.shape == (64,) and np.isfinite(out[0].embedding).all()


def test_exif_orientation_is_honoured(tiny_flow):
    upright = rgb(60, 20).transpose(Image.Transpose.ROTATE_270)  # what orientation 6 means
    out = client(tiny_flow).post(
        '/', DocumentArray([Document(blob=exif_rotated_jpeg()), Document(blob=encoded(upright, 'JPEG'))])
    )
    assert np.corrcoef(out[0].embedding, out[1].embedding)[0, 1] > 0.99


@pytest.mark.parametrize('case', list(INVALID))
def test_bad_images_get_a_clear_error_naming_the_document(tiny_flow, case):
    docs = DocumentArray([Document(id='good', text='fine'), Document(id=f'bad {case}', blob=INVALID[case]())])
    with pytest.raises(BadServer) as err:
        client(tiny_flow).post('/', docs)
    assert f'bad {case}' in str(err.value) and "'good'" not in str(err.value)
    assert_serving(tiny_flow)


@pytest.mark.parametrize(
    'tensor',
    [
        np.zeros((2, 2, 2, 2)),
        np.zeros((8, 8, 7)),
        np.full((8, 8, 3), np.inf),
        np.array([['a', 'b'], ['c', 'd']]),
        np.zeros((0, 8, 3)),
    ],
)
def test_bad_tensors(tiny_flow, tensor):
    with pytest.raises(BadServer, match='tensor'):
        client(tiny_flow).post('/', DocumentArray([Document(id='tensor', tensor=tensor)]))
    assert_serving(tiny_flow)


@pytest.mark.parametrize(
    'uri, reason',
    [
        ('data:image/png;base64,' + 'A' * (30 * 1024 * 1024), 'larger than the limit'),
        ('data:image/png;base64,%%%', 'base64'),
        ('data:image/png,' + 'x' * 100, 'decode'),
        ('data:', 'no comma'),
    ],
)
def test_malformed_and_huge_data_uris(tiny_flow, uri, reason):
    with pytest.raises(BadServer) as err:
        client(tiny_flow).post('/', DocumentArray([Document(id='uri', uri=uri)]))
    assert 'uri' in str(err.value) and reason in str(err.value)
    assert_serving(tiny_flow)


@pytest.mark.parametrize(
    'text', ['word ' * 200_000, ''.join(map(chr, range(1, 32))) * 100, '🐶🐱🦊' * 1000, '\u200b' * 5000]
)
def test_huge_and_strange_texts_are_truncated_never_errors(tiny_flow, text):
    out = client(tiny_flow).post('/', DocumentArray([Document(text=text)]))
    assert out[0].embedding.shape == (64,) and np.isfinite(out[0].embedding).all()


def test_a_request_of_ten_thousand_documents(tiny_flow):
    docs = DocumentArray([Document(id=str(i), text=f'doc {i}') for i in range(10_000)])
    out = client(tiny_flow).post('/', docs, request_size=10_000)
    assert len(out) == 10_000 and [d.id for d in out[:3]] == ['0', '1', '2']
    assert out.embeddings.shape == (10_000, 64)


@pytest.mark.parametrize(
    'parameters, name',
    [
        ({'drop_image_content': 3}, 'drop_image_content'),
        ({'drop_image_content': None}, 'drop_image_content'),
        ({'access_paths': ['@r']}, 'access_paths'),
        ({'traversal_paths': ''}, 'traversal_paths'),
        ({'allow_empty_matches': 'maybe'}, 'allow_empty_matches'),
    ],
)
def test_known_parameters_with_wrong_types_or_values(tiny_flow, parameters, name):
    endpoint = '/rank' if 'allow_empty_matches' in parameters else '/'
    docs = DocumentArray([Document(text='q', matches=[Document(text='m')])])
    with pytest.raises(BadServer, match=name):
        client(tiny_flow).post(endpoint, docs, parameters=parameters)
    assert_serving(tiny_flow)


def test_blob_as_base64_text_over_http(tiny_flow):
    import requests

    body = {'execEndpoint': '/', 'data': [{'blob': base64.b64encode(VALID['WebP']()).decode()}]}
    reply = requests.post(f'http://127.0.0.1:{tiny_flow["http"]}/post', json=body, timeout=60).json()
    assert len(reply['data'][0]['embedding']) == 64
