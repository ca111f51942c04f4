"""flows/onnx-v2.yml in the DocArray v2 environment: every input kind, /rank, per-document errors, hostile inputs,
docarray's own TextDoc/ImageDoc, the HTTP routes of v2 (one per endpoint), readiness and metrics.

Embeddings are compared with the v1 Flow's for the same export (tests/v2/inputs.py): cosine >= 0.99999.
"""

import io
import urllib.request

import numpy as np
import pytest
import requests
from docarray import DocList
from docarray.documents import ImageDoc, TextDoc
from jina import Client
from jina.excepts import BadServer

from clipserve.serving.schemas import ClipDoc, ClipMatch, ClipQuery

from .conftest import shipped_flow
from .inputs import IMAGES, MIN_COSINE, TEXTS, cosines, data_uri, pixels, png


@pytest.fixture(scope='module')
def flow(export_dir, image_folder, tmp_path_factory):
    from tests.integration.conftest import free_port, wait_for

    ports, metrics = [free_port() for _ in range(3)], [free_port(), free_port()]

    def edit(config):
        config['gateway']['port_monitoring'] = metrics[0]
        config['executors'][0]['port_monitoring'] = metrics[1]

    env = {
        'CLIPSERVE_ALLOW_LOCAL_FILES': 'true',
        'CLIPSERVE_LOCAL_FILES_ROOT': str(image_folder),
        'CLIPSERVE_MAX_IMAGE_PIXELS': 4_000_000,
    }
    with shipped_flow('onnx-v2.yml', tmp_path_factory.mktemp('flows'), export_dir, ports, env, edit):
        http = f'http://127.0.0.1:{ports[1]}'
        wait_for(lambda: requests.get(f'{http}/readyz', timeout=5).status_code == 200, 60, 'the Flow to be ready')
        yield {'grpc': ports[0], 'http': ports[1], 'websocket': ports[2], 'metrics': metrics, 'url': http}


def client(flow, protocol='grpc'):
    return Client(host='127.0.0.1', port=flow[protocol], protocol=protocol)


KINDS = ('uri', 'bytes', 'tensor', 'file')


def every_kind(image_folder, kinds=KINDS) -> list[ClipDoc]:
    """Each image as each input kind, after the texts."""
    docs = [ClipDoc(id=f'text-{i}', text=t) for i, t in enumerate(TEXTS)]
    for i, data in enumerate(IMAGES):
        made = {
            'uri': ClipDoc(id=f'uri-{i}', url=data_uri(data)),
            'bytes': ClipDoc(id=f'bytes-{i}', bytes_=data),
            'tensor': ClipDoc(id=f'tensor-{i}', tensor=pixels(data)),
            'file': ClipDoc(id=f'file-{i}', url=str(image_folder / f'image-{i}.png')),
        }
        docs += [made[kind] for kind in kinds]
    return docs


@pytest.mark.parametrize('protocol', ['grpc', 'http', 'websocket'])
def test_every_input_kind_gives_the_v1_flows_embeddings(flow, reference, image_folder, protocol):
    # Jina's HTTP client sends JSON, which has no bytes: images go as data: URIs, files or pixels there
    kinds = [k for k in KINDS if protocol != 'http' or k != 'bytes']
    docs = DocList[ClipDoc](every_kind(image_folder, kinds))
    out = client(flow, protocol).post('/encode', docs, return_type=DocList[ClipDoc], request_size=5)
    got = {d.id: np.asarray(d.embedding) for d in out}
    assert len(got) == len(docs)
    for i in range(len(TEXTS)):
        assert cosines(got[f'text-{i}'], reference['texts'][i]) >= MIN_COSINE
    for i in range(len(IMAGES)):
        for kind in kinds:
            assert cosines(got[f'{kind}-{i}'], reference['images'][i]) >= MIN_COSINE, (kind, i)
    if protocol != 'http':  # JSON carries numbers as float64
        assert all(d.embedding.dtype == np.float32 for d in out)


def test_the_default_endpoint_encodes_and_drops_image_payloads_on_request(flow, reference):
    docs = DocList[ClipDoc]([ClipDoc(text=TEXTS[0]), ClipDoc(bytes_=IMAGES[0])])
    out = client(flow).post('/', docs, parameters={'drop_image_content': True}, return_type=DocList[ClipDoc])
    assert cosines(out[0].embedding, reference['texts'][0]) >= MIN_COSINE
    assert cosines(out[1].embedding, reference['images'][0]) >= MIN_COSINE
    assert out[1].bytes_ is None


def test_docarrays_own_text_and_image_documents_are_read(flow, reference):
    texts = client(flow).post('/encode', DocList[TextDoc]([TextDoc(text=TEXTS[1])]), return_type=DocList[ClipDoc])
    assert cosines(texts[0].embedding, reference['texts'][1]) >= MIN_COSINE
    images = DocList[ImageDoc]([ImageDoc(url=data_uri(IMAGES[2])), ImageDoc(tensor=pixels(IMAGES[2]))])
    out = client(flow).post('/encode', images, return_type=DocList[ClipDoc])
    assert all(cosines(d.embedding, reference['images'][2]) >= MIN_COSINE for d in out)


@pytest.mark.parametrize('protocol', ['grpc', 'http'])
def test_rank_scores_and_sorts_the_matches(flow, reference, protocol):
    candidates = [ClipMatch(id='img-0', url=data_uri(IMAGES[0])), ClipMatch(id='txt-1', text=TEXTS[1])]
    candidates.append(ClipMatch(id='txt-0', text=TEXTS[0]))
    query = ClipQuery(id='q', text=TEXTS[0], matches=DocList[ClipMatch](candidates))
    [answer] = client(flow, protocol).post('/rank', DocList[ClipQuery]([query]), return_type=DocList[ClipQuery])
    scores = [m.clip_score for m in answer.matches]
    assert scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-6
    assert answer.matches[0].id == 'txt-0' and answer.matches[0].clip_score_cosine == pytest.approx(1, abs=1e-5)
    expected = {'img-0': reference['images'][0], 'txt-1': reference['texts'][1], 'txt-0': reference['texts'][0]}
    for match in answer.matches:
        assert match.clip_score_cosine == pytest.approx(cosines(reference['texts'][0], expected[match.id]), abs=1e-5)
        assert match.siglip_score is None and match.embedding is None


def test_a_query_without_matches_is_refused_by_name(flow):
    with pytest.raises(BadServer, match='lonely'):
        client(flow).post(
            '/rank', DocList[ClipQuery]([ClipQuery(id='lonely', text='x')]), return_type=DocList[ClipQuery]
        )


def test_a_corrupt_image_is_named_and_the_flow_keeps_serving(flow, reference):
    docs = DocList[ClipDoc]([ClipDoc(id='fine', text=TEXTS[0]), ClipDoc(id='broken-png', bytes_=IMAGES[0][:40])])
    with pytest.raises(BadServer, match='broken-png'):
        client(flow).post('/encode', docs, return_type=DocList[ClipDoc])
    reply = requests.post(
        f'{flow["url"]}/encode', json={'data': [{'id': 'bad-uri', 'url': 'data:image/png;base64,AAAA'}]}
    )
    assert reply.status_code >= 400 and 'bad-uri' in reply.text
    [again] = client(flow).post('/encode', DocList[ClipDoc]([ClipDoc(text=TEXTS[0])]), return_type=DocList[ClipDoc])
    assert cosines(again.embedding, reference['texts'][0]) >= MIN_COSINE


def decompression_bomb() -> bytes:
    """A 10000 x 10000 PNG of one colour: a few kB on the wire, 300 MB once decoded."""
    from PIL import Image

    out = io.BytesIO()
    Image.new('L', (10_000, 10_000)).save(out, format='PNG', optimize=True)
    return out.getvalue()


def test_hostile_images_are_refused_before_they_cost_memory(flow):
    bomb = decompression_bomb()
    assert len(bomb) < 200_000
    for doc in (ClipDoc(id='bomb', bytes_=bomb), ClipDoc(id='huge-tensor', tensor=np.zeros((5000, 1000, 3), np.uint8))):
        with pytest.raises(BadServer, match=doc.id):
            client(flow).post('/encode', DocList[ClipDoc]([doc]), return_type=DocList[ClipDoc])
    with pytest.raises(BadServer, match='outside|local|allow'):
        client(flow).post(
            '/encode', DocList[ClipDoc]([ClipDoc(id='etc', url='/etc/passwd')]), return_type=DocList[ClipDoc]
        )
    with pytest.raises(BadServer, match='access_paths'):
        client(flow).post('/encode', DocList[ClipDoc]([ClipDoc(text='x')]), parameters={'access_paths': '@c'})


def test_http_has_one_route_per_endpoint_and_no_post(flow, reference):
    paths = requests.get(f'{flow["url"]}/openapi.json', timeout=10).json()['paths']
    for route in ('/encode', '/rank', '/default', '/clipserve/info', '/v1/embeddings'):
        assert route in paths or route.startswith('/v1'), sorted(paths)
    assert '/post' not in paths
    reply = requests.post(
        f'{flow["url"]}/encode', json={'data': [{'text': TEXTS[2]}, {'bytes_': None, 'url': data_uri(IMAGES[1])}]}
    )
    assert reply.status_code == 200, reply.text[:2000]
    data = reply.json()['data']
    assert cosines(data[0]['embedding'], reference['texts'][2]) >= MIN_COSINE
    assert cosines(data[1]['embedding'], reference['images'][1]) >= MIN_COSINE


def test_readiness_and_metrics(flow):
    assert requests.get(f'{flow["url"]}/readyz', timeout=5).json() == {'status': 'ready'}
    client(flow).post('/encode', DocList[ClipDoc]([ClipDoc(text='count me'), ClipDoc(bytes_=png(9))]))
    executor = urllib.request.urlopen(f'http://127.0.0.1:{flow["metrics"][1]}/', timeout=10).read().decode()
    for name in ('clipserve_preprocess_seconds', 'clipserve_inference_seconds', 'clipserve_docs_per_request'):
        assert name in executor, name
    assert 'clipserve_errors_total' in executor and 'cause="invalid_document"' in executor
    gateway = urllib.request.urlopen(f'http://127.0.0.1:{flow["metrics"][0]}/', timeout=10).read().decode()
    assert 'jina_' in gateway
    # the replica's bound came through its v2 readiness report: the gateway mirrors its 16 places and its own
    # share of the replica's queue (max_requests 16 + the gateway's max_queued_large 32: the defaults)
    assert 'clipserve_gateway_executor_places{executor="clip_o"} 48.0' in gateway
