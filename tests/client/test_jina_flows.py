"""clipserve_client.jina against real Flows (flows/multi-protocol.yml, flows/tls.yml) over gRPC, HTTP and WebSocket."""

import asyncio
import io
import threading
from pathlib import Path

import numpy as np
import pytest
from docarray import Document, DocumentArray
from PIL import Image

from clipserve_client.jina import Client, ServerError
from tests.integration.conftest import TINY, data_uri, make_image

from ..compare import assert_close
from .conftest import PROTOCOLS, url

TEXTS = ['a photo of a dog', 'a photo of a cat', 'a red car', 'two people on a beach', 'a bowl of soup']


@pytest.fixture(scope='module')
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp('images') / 'photo.png'
    path.write_bytes(make_image(seed=3))
    return path


# ---- encode ---------------------------------------------------------------------------------


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_encode_texts_matches_the_model(plain_flow, reference, protocol):
    out = Client(url(protocol, plain_flow[protocol])).encode(TEXTS, batch_size=2)
    assert isinstance(out, np.ndarray) and out.shape == (len(TEXTS), 64) and out.dtype == np.float32
    assert_close(out, reference(TEXTS), rel=1e-5)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_encode_over_tls_with_ca_file(tls_flow, certificate, reference, protocol):
    client = Client(url(protocol, tls_flow[protocol], tls=True, host='localhost'), ca_file=certificate[0])
    assert_close(client.encode(TEXTS[:2]), reference(TEXTS[:2]), rel=1e-5)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_tls_without_trust_fails_at_once(tls_flow, protocol):
    """The test certificate is in no system store: a clear error, and no retries for a TLS failure."""
    client = Client(url(protocol, tls_flow[protocol], tls=True, host='localhost'), retries=5, backoff=2)
    with pytest.raises(ConnectionError, match='TLS') as err:
        client.encode(['x'], timeout=20)
    assert 'ca_file' in str(err.value)


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_every_image_input_gives_the_same_embedding(plain_flow, image_file, protocol):
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
        Document(blob=png),
        Document(tensor=pixels),
        Document(uri=str(image_file)),
    ]
    out = Client(url(protocol, plain_flow[protocol])).encode(inputs, batch_size=4)
    assert out.shape == (len(inputs), 64)
    for row in out[1:]:
        assert_close(row, out[0], rel=1e-5)
    assert np.abs(out[0]).sum() > 0


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_documents_are_filled_in_place_in_order_with_duplicate_ids(plain_flow, reference, protocol):
    """clip-client merges answers by id, so these four would get mixed up; here each gets its own."""
    docs = DocumentArray([Document(id='same', text=t) for t in TEXTS[:4]] + [Document(id='other', text=TEXTS[4])])
    originals = list(docs)
    out = Client(url(protocol, plain_flow[protocol])).encode(docs, batch_size=2, prefetch=3)
    assert isinstance(out, DocumentArray) and len(out) == 5
    assert all(a is b for a, b in zip(out, originals))
    assert [d.id for d in out] == ['same'] * 4 + ['other']
    assert_close(np.stack([d.embedding for d in originals]), reference(TEXTS), rel=1e-5)
    assert all(not d.blob and not d.uri and d.tensor is None for d in originals)  # nothing else changed


@pytest.mark.parametrize('protocol', ['grpc', 'http'])
def test_urls_are_fetched_by_the_client(plain_flow, image_server, protocol):
    client = Client(url(protocol, plain_flow[protocol]))
    out = client.encode([f'{image_server}/a.png', f'{image_server}/b.png', make_image()])
    assert_close(out[0], out[2], rel=1e-5)
    assert_close(out[1], out[2], rel=1e-5)


def test_a_generator_of_texts_returns_an_array(plain_flow, reference):
    out = Client(url('grpc', plain_flow['grpc'])).encode(t for t in TEXTS)
    assert_close(out, reference(TEXTS), rel=1e-5)


def test_unsupported_input_is_a_type_error(plain_flow):
    client = Client(url('grpc', plain_flow['grpc']))
    with pytest.raises(TypeError, match=r'input 1: cannot send a dict'):
        client.encode(['fine', {'text': 'no'}])
    with pytest.raises(TypeError, match='not a single str'):
        client.encode('a photo of a dog')


def test_empty_input_sends_nothing(plain_flow):
    client = Client(url('grpc', plain_flow['grpc']))
    assert client.encode([]) == []
    assert len(client.encode(DocumentArray())) == 0


# ---- parameters, errors, callbacks ----------------------------------------------------------


def test_model_name_selects_the_endpoint(plain_flow, reference):
    client = Client(url('grpc', plain_flow['grpc']))
    assert_close(client.encode(TEXTS[:1], parameters={'model_name': TINY}), reference(TEXTS[:1]), rel=1e-5)
    with pytest.raises(ServerError, match='ViT-H-14'):
        client.encode(TEXTS[:1], parameters={'model_name': 'ViT-H-14::laion2b-s32b-b79k'})


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_a_server_error_raises_or_goes_to_on_error(plain_flow, protocol):
    client = Client(url(protocol, plain_flow[protocol]))
    with pytest.raises(ServerError, match='input 1|1 document'):
        client.encode(['fine', b'not an image'])
    errors, always = [], []
    result = client.encode(['fine', b'not an image'], on_error=errors.append, on_always=always.append)
    assert result is None and len(errors) == 1 and len(always) == 1


def test_callbacks_see_the_callers_ids(plain_flow):
    seen = []
    docs = [Document(id=f'mine-{i}', text=t) for i, t in enumerate(TEXTS)]
    result = Client(url('grpc', plain_flow['grpc'])).encode(
        docs, batch_size=2, on_done=lambda response: seen.extend(d.id for d in response.docs)
    )
    assert result is None
    assert sorted(seen) == sorted(d.id for d in docs)
    assert all(d.embedding is not None for d in docs)  # filled in place even when streaming


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_profile(plain_flow, protocol, capsys):
    report = Client(url(protocol, plain_flow[protocol])).profile('a photo of a dog')
    assert set(report) == {'Roundtrip', 'Client-server network', 'Server', 'Gateway-CLIP network', 'CLIP model'}
    assert report['Roundtrip'] > 0 and report['CLIP model'] >= 0
    assert 'CLIP model' in capsys.readouterr().out


def test_sync_calls_work_inside_a_running_event_loop(plain_flow, reference):
    """As in a notebook: the call runs on its own thread and loop instead of blocking this one."""

    async def main():
        return Client(url('grpc', plain_flow['grpc'])).encode(TEXTS[:2])

    assert_close(asyncio.run(main()), reference(TEXTS[:2]), rel=1e-5)


# ---- rank, index, search --------------------------------------------------------------------


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_rank_scores_and_reorders_the_callers_matches(plain_flow, image_file, protocol):
    matches = [
        Document(id='m', text='a photo of a dog'),
        Document(id='m', text='a bowl of soup'),
        Document(id='m', text='a red car'),
    ]
    query = Document(uri=str(image_file), matches=matches)
    out = Client(url(protocol, plain_flow[protocol])).rank([query])
    assert out[0] is query
    ranked = list(query.matches)
    assert sorted(map(id, ranked)) == sorted(map(id, matches))  # the caller's own objects
    scores = [m.scores['clip_score'].value for m in ranked]
    assert scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-5
    assert all('clip_score_cosine' in m.scores for m in ranked)


def test_rank_needs_matches(plain_flow):
    with pytest.raises(ValueError, match='matches'):
        Client(url('grpc', plain_flow['grpc'])).rank([Document(text='alone')])


@pytest.mark.parametrize('protocol', ['grpc', 'http'])
def test_index_keeps_ids_and_returns_embeddings(plain_flow, protocol):
    """The encoder's catch-all encodes /index, standing in for an indexer."""
    docs = [Document(id=f'doc-{i}', text=t, tags={'n': i}) for i, t in enumerate(TEXTS)]
    out = Client(url(protocol, plain_flow[protocol])).index(docs + ['a plain string'], batch_size=2)
    assert [d.id for d in out][:5] == [d.id for d in docs] and out[0] is docs[0]
    assert all(d.embedding is not None and d.embedding.shape == (64,) for d in out)
    assert out[5].text == 'a plain string'
    with pytest.raises(ValueError, match='unique ids'):
        Client(url(protocol, plain_flow[protocol])).index([Document(id='x', text='a'), Document(id='x', text='b')])


def test_search_sends_limit(plain_flow):
    parameters = []
    out = Client(url('grpc', plain_flow['grpc'])).search(
        TEXTS[:2], limit=3, on_always=lambda response: parameters.append(response.parameters)
    )
    assert out is None and parameters[0]['limit'] == 3
    out = Client(url('grpc', plain_flow['grpc'])).search(TEXTS[:2], limit=3)
    assert [d.text for d in out] == TEXTS[:2] and all(d.embedding is not None for d in out)


def test_async_methods(plain_flow, reference, image_file):
    client = Client(url('websocket', plain_flow['websocket']))

    async def main():
        query = Document(text='a dog', matches=[Document(text='dog'), Document(text='car')])
        return await asyncio.gather(
            client.aencode(TEXTS), client.arank([query]), client.aindex(TEXTS[:2]), client.asearch(TEXTS[:2], limit=2)
        )

    encoded, ranked, indexed, searched = asyncio.run(main())
    assert_close(encoded, reference(TEXTS), rel=1e-5)
    assert len(ranked[0].matches) == 2 and 'clip_score' in ranked[0].matches[0].scores
    assert all(d.embedding is not None for d in list(indexed) + list(searched))


# ---- volume and concurrency -----------------------------------------------------------------


def test_ten_thousand_texts_with_a_progress_bar(plain_flow, capfd):
    """20 requests of 500 at once (prefetch 100): more documents than a replica's max_documents (4096); the
    ones past it wait for room in the replica (none refused; the retries are room for a slow machine)."""
    texts = [f'caption {i}' for i in range(10_000)]
    out = Client(url('grpc', plain_flow['grpc']), retries=8).encode(texts, batch_size=500, show_progress=True)
    assert out.shape == (10_000, 64)
    assert not np.allclose(out[0], out[1])
    rendered = capfd.readouterr().err
    assert '10000/10000' in rendered and 'docs/s' in rendered and 'ETA' in rendered


@pytest.mark.parametrize('protocol', PROTOCOLS)
def test_four_threads_each_get_their_own_results(plain_flow, reference, protocol, capfd, caplog):
    client = Client(url(protocol, plain_flow[protocol]))
    texts = {n: [f'thread {n} caption {i}' for i in range(60)] for n in range(4)}
    results, errors = {}, []

    def work(n):
        try:
            results[n] = client.encode(texts[n], batch_size=7)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for n in range(4):
        assert_close(results[n], reference(texts[n]), rel=1e-5)
    noise = capfd.readouterr().err + caplog.text  # grpc.aio in several loops logs BlockingIOErrors
    assert 'BlockingIOError' not in noise and 'Exception in callback' not in noise


def test_image_files_as_path_objects_in_documents_mode(plain_flow, image_file):
    """A mixed list led by a Document returns Documents, created ones for the other inputs."""
    out = Client(url('grpc', plain_flow['grpc'])).encode([Document(text='a dog'), Path(image_file), 'a cat'])
    assert isinstance(out, DocumentArray) and out[0].text == 'a dog' and out[2].text == 'a cat'
    assert out[1].uri == str(image_file) and all(d.embedding is not None for d in out)
