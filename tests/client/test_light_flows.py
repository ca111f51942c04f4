"""clipserve_client (the light client) against real Flows: flows/multi-protocol.yml's HTTP port, flows/tls.yml
over https with the test's own certificate, and flows/auth.yml with a token.

Its vectors are the server's L2-normalised ones, so they are compared by cosine with the model's own
(computed in this process) and with the Jina-protocol client's over gRPC.
"""

import asyncio
import io
import os
import time

import numpy as np
import pytest
from PIL import Image

from clipserve_client import (
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    BadRequestError,
    Client,
    Model,
    NotFoundError,
)
from clipserve_client import jina as jina_client
from tests.integration.conftest import TINY, data_uri, flow_from_yaml, free_port, make_image, set_port

from ..compare import assert_close, assert_cosine, cosines
from .conftest import url

TEXTS = ['a photo of a dog', 'a photo of a cat', 'a red car', 'two people on a beach', 'a bowl of soup']
SAME = 0.99999  # cosine: the same vector up to float32 rounding


def unit(rows):
    rows = np.asarray(rows, np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


@pytest.fixture(scope='module')
def http_url(plain_flow):
    return url('http', plain_flow['http'])


@pytest.fixture(scope='module')
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp('images') / 'photo.png'
    path.write_bytes(make_image(seed=3))
    return path


# ---- encode ---------------------------------------------------------------------------------


def test_texts_equal_the_models_embeddings_normalised(http_url, reference):
    with Client(http_url) as client:
        out = client.encode(TEXTS, batch_size=2)
    assert isinstance(out, np.ndarray) and out.shape == (len(TEXTS), 64) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1, rtol=1e-5)
    assert_cosine(out, reference(TEXTS), SAME)
    assert cosines(out[0], out[1])[0] < 0.999  # different texts, different vectors


def test_every_image_input_gives_the_jina_clients_embedding(plain_flow, http_url, image_file):
    png = image_file.read_bytes()
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert('RGB'))
    inputs = [
        png,  # bytes
        pixels,  # numpy HWC uint8
        pixels.astype(np.float32) / 255,  # numpy HWC float in [0, 1]
        Image.open(io.BytesIO(png)),  # PIL
        image_file,  # pathlib.Path
        str(image_file),  # an image file name
        data_uri(png),  # a data: URI
        {'image': png},
        {'image': str(image_file)},
    ]
    out = Client(http_url).encode(inputs, batch_size=4)
    assert out.shape == (len(inputs), 64)
    for row in out[1:]:
        assert_close(row, out[0], rel=1e-5)
    over_grpc = jina_client.Client(url('grpc', plain_flow['grpc'])).encode([png])
    assert_cosine(out[:1], over_grpc, SAME)


def test_a_mixed_list_comes_back_in_input_order(http_url, image_file, reference):
    client = Client(http_url)
    mixed = client.encode([TEXTS[0], image_file, TEXTS[1], {'text': 'http://example.com is a caption here'}])
    assert_cosine(mixed[[0, 2]], reference(TEXTS[:2]), SAME)
    assert_cosine(mixed[1], client.encode([image_file]), SAME)
    assert_cosine(mixed[3], reference(['http://example.com is a caption here']), SAME)  # sent as a text


def test_urls_are_downloaded_by_the_client_unless_told_otherwise(http_url, image_server):
    """The server's default URI policy refuses remote URLs: the client fetches them itself by default."""
    out = Client(http_url).encode([f'{image_server}/a.png', make_image()])
    assert_cosine(out[0], out[1], SAME)
    with pytest.raises(BadRequestError, match=r'input\[1\].*remote URIs is disabled') as err:
        Client(http_url, fetch_urls=False).encode(['a caption', f'{image_server}/a.png'])
    assert err.value.status == 400 and err.value.param == 'input[1]'


def test_a_generator_of_many_inputs_in_batches_with_a_progress_callback(http_url, reference):
    texts = [f'caption number {i}' for i in range(1000)]
    seen = []
    out = Client(http_url, batch_size=128).encode((t for t in texts), progress=lambda done, total: seen.append(done))
    assert out.shape == (1000, 64)
    assert seen == [128 * k for k in range(1, 8)] + [1000]
    picks = [0, 127, 128, 999]
    assert_cosine(out[picks], reference([texts[i] for i in picks]), SAME)


def test_a_tqdm_bar(http_url, capsys):
    Client(http_url).encode(TEXTS * 20, batch_size=25, progress=True)
    assert '100/100' in capsys.readouterr().err


# ---- errors from the real server ------------------------------------------------------------


def test_a_bad_image_is_a_400_naming_its_position_in_the_callers_list(http_url):
    """The server numbers the items of one request; the client renumbers them across its batches."""
    inputs = ['a', 'b', 'c', b'not an image', 'e']
    with pytest.raises(BadRequestError) as err:
        Client(http_url).encode(inputs, batch_size=2)
    assert err.value.status == 400 and err.value.param == 'input[3]'
    assert 'input[3]' in str(err.value) and 'input[1]' not in str(err.value)


def test_encode_partial_costs_a_bad_input_only_its_own_row(http_url, image_file, tmp_path):
    """Refused by the server (an undecodable image, named in the error's `items`) or unreadable here (a
    missing file): those rows fail with their reasons; every other input gets the vector `encode` gives it."""
    inputs = ['a', b'not an image', 'c', tmp_path / 'missing.jpg', image_file, b'\x89PNG broken', 'g']
    good = [0, 2, 4, 6]
    expected = Client(http_url).encode([inputs[i] for i in good])
    result = Client(http_url).encode_partial(inputs, batch_size=3)
    assert result.indices == good and len(result) == len(inputs)
    assert_cosine(result.vectors, expected, SAME)
    assert sorted(result.failed) == [1, 3, 5]
    assert 'the server refused it' in result.failed[1] and 'the server refused it' in result.failed[5]
    assert 'input 3' in result.failed[3] and 'missing.jpg' in result.failed[3]

    async def main():
        async with AsyncClient(http_url, max_concurrency=2, batch_size=2) as client:
            return await client.encode_partial(inputs)

    concurrent = asyncio.run(main())
    assert concurrent.indices == good and concurrent.failed == result.failed
    assert_cosine(concurrent.vectors, expected, SAME)


def test_the_servers_error_names_each_bad_item_by_position(http_url):
    with pytest.raises(BadRequestError) as err:
        Client(http_url).encode(['a', b'not an image', 'c', b'nor this'], batch_size=4)
    assert [(item.index, item.param) for item in err.value.items] == [(1, 'input[1]'), (3, 'input[3]')]
    assert all(item.message and item.message in err.value.message for item in err.value.items)
    with pytest.raises(BadRequestError) as err:  # renumbered to the caller's list across batches
        Client(http_url).encode(['a', 'b', 'c', b'not an image'], batch_size=2)
    assert [(item.index, item.param) for item in err.value.items] == [(3, 'input[3]')]


def test_an_unknown_model_is_a_404_listing_the_served_ones(http_url):
    with pytest.raises(NotFoundError, match=TINY) as err:
        Client(http_url, model='ViT-H-14::laion2b-s32b-b79k').encode(['a dog'])
    assert err.value.code == 'model_not_found' and err.value.status == 404


def test_models(http_url):
    [model] = Client(http_url).models()
    assert model == Model(id=TINY, embedding_dimensions=64, modalities=('text', 'image'), aliases=(), default=True)
    assert Client(http_url, model=model.id).encode(['a dog']).shape == (1, 64)


def test_a_port_that_is_not_a_clipserve_gateway(plain_flow):
    """The WebSocket port is Jina's app without the /v1 routes."""
    with pytest.raises(NotFoundError, match='HTTP port of a clipserve gateway'):
        Client(url('http', plain_flow['websocket']), retries=0).models()


# ---- rank -----------------------------------------------------------------------------------


def test_rank_scores_in_document_order_as_the_cosines_of_the_embeddings(plain_flow, http_url, image_file):
    client = Client(http_url)
    documents = ['a bowl of soup', 'a photo of a dog', 'a red car']
    scores = client.rank(image_file, documents)
    assert scores.shape == (3,) and abs(scores.sum() - 1) < 1e-5
    cosine = client.rank(image_file, documents, score='clip_score_cosine')
    vectors = client.encode([image_file, *documents])
    np.testing.assert_allclose(cosine, vectors[1:] @ vectors[0], rtol=1e-4, atol=1e-6)
    softmax = np.exp(100 * cosine) / np.exp(100 * cosine).sum()
    np.testing.assert_allclose(scores, softmax, rtol=1e-4, atol=1e-7)

    from docarray import Document  # the Jina-protocol client's rank of the same query

    query = Document(uri=str(image_file), matches=[Document(id=str(i), text=t) for i, t in enumerate(documents)])
    jina_client.Client(url('grpc', plain_flow['grpc'])).rank([query])
    over_grpc = {m.id: m.scores['clip_score'].value for m in query.matches}
    np.testing.assert_allclose(scores, [over_grpc[str(i)] for i in range(3)], rtol=1e-4, atol=1e-7)


def test_rank_refuses_bad_arguments_before_sending(http_url):
    client = Client(http_url)
    with pytest.raises(ValueError, match='score must be one of'):
        client.rank('a', ['b'], score='bm25')
    with pytest.raises(TypeError, match='documents must be a list'):
        client.rank('a', 'b')
    with pytest.raises(TypeError, match='document 1: cannot send'):
        client.rank('a', ['b', 3.5])


# ---- async ----------------------------------------------------------------------------------


def test_the_async_client_equals_the_sync_one(http_url, image_file):
    texts = [f'text {i}' for i in range(40)]
    expected = Client(http_url).encode(texts)

    async def main():
        async with AsyncClient(http_url, max_concurrency=3, batch_size=4) as client:
            return await asyncio.gather(
                client.encode(texts), client.rank(image_file, TEXTS[:3]), client.models(), client.encode([image_file])
            )

    encoded, scores, models, image = asyncio.run(main())
    assert_cosine(encoded, expected, SAME)
    np.testing.assert_allclose(scores, Client(http_url).rank(image_file, TEXTS[:3]), rtol=1e-4, atol=1e-7)
    assert models[0].id == TINY and image.shape == (1, 64)


# ---- TLS ------------------------------------------------------------------------------------


def test_https_with_a_ca_file(tls_flow, certificate, reference):
    with Client(url('http', tls_flow['http'], tls=True, host='localhost'), ca_file=certificate[0]) as client:
        assert_cosine(client.encode(TEXTS[:2]), reference(TEXTS[:2]), SAME)


def test_https_without_trust_fails_at_once_naming_ca_file(tls_flow):
    """The test's certificate is in no system store: a clear error, and a TLS failure is not retried."""
    client = Client(url('http', tls_flow['http'], tls=True, host='localhost'), retries=5, backoff=2)
    started = time.monotonic()
    with pytest.raises(APIConnectionError, match='TLS') as err:
        client.encode(['x'])
    assert 'ca_file' in str(err.value) and time.monotonic() - started < 5


# ---- the token ------------------------------------------------------------------------------

TOKEN = 'light-client-token'


@pytest.fixture(scope='module')
def auth_url(tmp_path_factory):
    """flows/auth.yml (ClipServeGateway, auth: required) with the token; its HTTP port."""
    ports = [free_port() for _ in range(3)]
    env = {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_AUTH_TOKEN': TOKEN}
    flow = flow_from_yaml('auth.yml', tmp_path_factory.mktemp('flows'), lambda c: set_port(c, ports), env)
    saved = os.environ.get('CLIPSERVE_AUTH_TOKEN')
    os.environ['CLIPSERVE_AUTH_TOKEN'] = TOKEN  # the gateway process reads it when it starts
    try:
        with flow:
            os.environ.pop('CLIPSERVE_AUTH_TOKEN')  # the tests below choose what the client sees
            yield url('http', ports[1])
    finally:
        os.environ.pop('CLIPSERVE_AUTH_TOKEN', None)
        if saved is not None:
            os.environ['CLIPSERVE_AUTH_TOKEN'] = saved


def test_the_token_as_an_argument_and_from_the_environment(auth_url, monkeypatch):
    assert Client(auth_url, token=TOKEN).encode(['a dog']).shape == (1, 64)
    monkeypatch.setenv('CLIPSERVE_AUTH_TOKEN', TOKEN)
    assert Client(auth_url).encode(['a dog']).shape == (1, 64)


def test_a_missing_or_wrong_token_is_a_401_at_once(auth_url):
    for token in (None, 'wrong'):
        started = time.monotonic()
        with pytest.raises(AuthenticationError, match='token') as err:
            Client(auth_url, token=token, retries=5, backoff=2).models()
        assert err.value.status == 401 and err.value.code == 'invalid_api_key'
        assert time.monotonic() - started < 5  # not retried
