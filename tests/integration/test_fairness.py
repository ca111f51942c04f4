"""Fair under load, measured from a client: a small request is not stuck behind large ones, nor behind a slow
host another request named, and a request past its deadline is dropped, not computed.

ViT-B-32 (random weights) makes one forward pass of 8 images long enough (a few hundred ms on a CPU) that
the gRPC and Jina overhead does not decide the outcome; "one batch" is measured in the same run, as the
answer time of one request of 8 images on the idle Flow. The head-of-line cases run behind both kinds of
gateway: Jina's own (a Python Flow, as clip-as-service's YAMLs have) and clipserve's (flows/torch.yml).
"""

import http.server
import json
import subprocess
import sys
import threading
import time

import pytest
from docarray import Document, DocumentArray
from jina import Client, Flow

from clipserve import CLIPEncoder

from ..waiting import wait_until
from .conftest import flow_from_yaml, free_port, make_image

MODEL = 'ViT-B-32::random'
SLOW_SECONDS = 6


class SlowHandler(http.server.BaseHTTPRequestHandler):
    asked: list = []  # one entry per GET begun: the test waits on it to know the fetches are under way

    def log_message(self, *args):
        pass

    def do_GET(self):
        SlowHandler.asked.append(self.path)
        time.sleep(SLOW_SECONDS)  # a slow (allowed) host
        body = make_image(seed=3)
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope='module')
def slow_host():
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), SlowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()


@pytest.fixture(scope='module', params=['jina-gateway', 'clipserve-gateway'])
def flow(request, slow_host, tmp_path_factory):
    uses_with = {'name': MODEL, 'allow_remote_uris': True, 'remote_allowed_hosts': '127.0.0.1', 'remote_timeout': 20}
    uses_with['max_documents'] = 8192  # the three large requests below are all admitted, as in the scenario
    if request.param == 'jina-gateway':
        flow = Flow(port=free_port()).add(uses=CLIPEncoder, uses_with=uses_with, timeout_ready=-1)
    else:

        def edit(config):
            config['gateway']['port'] = free_port()
            config['executors'][0]['uses']['with'].update(uses_with)

        flow = flow_from_yaml('torch.yml', tmp_path_factory.mktemp('flows'), edit)
    with flow as f:
        f.gateway_kind = request.param
        yield f


def jina_gateway_only(flow):
    if flow.gateway_kind != 'jina-gateway':
        pytest.skip("the replica's deadlines and bounds: once, behind Jina's gateway")


def post(flow, docs, parameters=None):
    started = time.monotonic()
    out = Client(host='127.0.0.1', port=flow.port).post('/', docs, parameters=parameters or {}, request_size=len(docs))
    return out, time.monotonic() - started


def replica_info(flow) -> dict:
    """The replica's /clipserve/info: its admission neither counts nor refuses it, so it answers under load."""
    client = Client(host='127.0.0.1', port=flow.port)
    [info] = (
        client.post('/clipserve/info', DocumentArray([Document()]), return_responses=True)[0]
        .parameters['__results__']
        .values()
    )
    return info


# The other clients run in processes of their own, as real clients do: Jina's client serialises the calls of
# one process's threads, which would measure the client instead of the server.
OTHER_CLIENT = """
import json, sys, time
from docarray import Document, DocumentArray
from jina import Client
sys.path.insert(0, sys.argv[3])
from tests.integration.conftest import make_image
spec = json.loads(sys.argv[2])
docs = DocumentArray([Document(uri=u) for u in spec.get('uris', [])])
docs.extend(Document(blob=make_image(64, 48, seed=spec['seed'] + i)) for i in range(spec.get('images', 0)))
started = time.monotonic()
try:
    Client(host='127.0.0.1', port=int(sys.argv[1])).post('/', docs, parameters=spec.get('parameters', {}), request_size=len(docs))
    print(json.dumps({'ok': True, 'seconds': time.monotonic() - started}))
except Exception as error:
    print(json.dumps({'ok': False, 'error': repr(error)[-500:], 'seconds': time.monotonic() - started}))
"""


def other_client(flow, **spec) -> subprocess.Popen:
    root = str(__import__('pathlib').Path(__file__).resolve().parents[2])
    command = [sys.executable, '-c', OTHER_CLIENT, str(flow.port), json.dumps({'seed': 0, **spec}), root]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def answer(process: subprocess.Popen, timeout: float = 180) -> dict:
    out, _ = process.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def images(n, seed=0):
    return DocumentArray([Document(blob=make_image(64, 48, seed=seed + i)) for i in range(n)])


@pytest.fixture(scope='module')
def one_batch(flow):
    post(flow, images(8))  # warm
    return min(post(flow, images(8, seed=100 + n))[1] for n in range(3))


def test_a_blob_is_not_held_up_by_another_requests_slow_host(flow, slow_host, one_batch):
    SlowHandler.asked.clear()
    held = other_client(flow, uris=[f'{slow_host}/image-{i}.png' for i in range(12)])
    wait_until(lambda: SlowHandler.asked, 'its fetches are under way', seconds=120)
    out, seconds = post(flow, images(1, seed=50))
    print(f'\none batch {one_batch:.2f}s; a blob behind 12 slow URIs answered in {seconds:.2f}s')
    assert out[0].embedding is not None and seconds < 3 * one_batch
    slow = answer(held)
    assert slow['ok'] and slow['seconds'] >= SLOW_SECONDS, slow


def test_a_text_is_not_held_up_behind_large_requests(flow, one_batch):
    # a deadline, so that the large ones end soon after: dropped, not computed
    encoded = replica_info(flow)['images_encoded']
    large = [other_client(flow, images=1500, seed=1000 * k, parameters={'timeout_seconds': 30}) for k in range(3)]

    def all_three_running():
        info = replica_info(flow)
        return info['documents_in_flight'] == 3 * 1500 and info['images_encoded'] > encoded

    wait_until(all_three_running, 'all three are admitted and the model runs their images', seconds=25, every=0.25)
    out, seconds = post(flow, DocumentArray([Document(text='a photo of a dog')]))
    print(f'\none batch {one_batch:.2f}s; a text behind 3 x 1,500 images answered in {seconds:.2f}s')
    assert out[0].embedding is not None and seconds < 3 * one_batch
    for process in large:  # past their deadline: a clear error, and the Flow keeps serving
        result = answer(process)
        assert not result['ok'] and 'deadline' in result['error'].lower(), result
    assert post(flow, images(1))[0][0].embedding is not None


def test_a_request_past_its_deadline_is_dropped_with_a_clear_error(flow):
    jina_gateway_only(flow)
    with pytest.raises(Exception, match='DeadlineExceeded|deadline'):
        post(flow, images(64), {'timeout_seconds': 0.05})
    with pytest.raises(Exception, match='timeout_seconds'):
        post(flow, images(1), {'timeout_seconds': -1})


def test_past_its_document_bound_a_request_waits_for_room_and_small_ones_do_not(flow):
    """max_documents (8,192 here): of two requests of 5,000 images, the second waits for the first to leave
    (not refused: one client's batches may be that large), failing clearly if its deadline passes first, while a
    small request runs at once; the Flow keeps serving."""
    jina_gateway_only(flow)
    encoded = replica_info(flow)['images_encoded']
    first = other_client(flow, images=5000, seed=7, parameters={'timeout_seconds': 30})

    def admitted_and_running():
        info = replica_info(flow)
        return info['documents_in_flight'] == 5000 and info['images_encoded'] > encoded

    wait_until(admitted_and_running, 'the first is admitted and the model runs its images', seconds=25, every=0.25)
    with pytest.raises(Exception, match='max_documents') as late:
        post(flow, images(5000, seed=9), {'timeout_seconds': 2})
    # refused by its own deadline while it waited, not after the first left: the first still runs (below)
    assert 'deadline exceeded waiting in the queue' in str(late.value)
    assert post(flow, images(1))[0][0].embedding is not None  # small: no wait for documents
    assert first.poll() is None  # all this while the first still runs
    assert not answer(first)['ok']  # its own deadline
    assert post(flow, images(1))[0][0].embedding is not None
