"""`embed --server URL` through a real Flow (flows/multi-protocol.yml, its HTTP port's POST /v1/embeddings), and
URL inputs fetched from a real HTTP server on loopback under the server's URI policy."""

from __future__ import annotations

import functools
import http.server
import threading

import numpy as np
import pytest

from clipserve.jobs.cli import main as embed

from ..bulk_collection import TINY, cosines, image_bytes, make_folder, read_output, run_embed
from .conftest import flow_from_yaml, free_port, set_port

MAX_IMAGE_BYTES = 30_000  # the encoder's limit, under the size of the one large image below


@pytest.fixture(scope='module')
def collection(tmp_path_factory):
    folder = make_folder(tmp_path_factory.mktemp('bulk') / 'images', n=12)
    (folder / 'large.png').write_bytes(image_bytes(99, 200, 200, 'PNG', noise=80))  # over the server's limit
    (folder / 'large.txt').write_text('a large noisy picture')
    return folder


@pytest.fixture(scope='module')
def local(collection, tmp_path_factory):
    out = tmp_path_factory.mktemp('local') / 'out'
    embed([str(collection), '--output', str(out), '--model', TINY, '--workers', '0', '--quiet'])
    return read_output(out)


@pytest.fixture(scope='module')
def http_port(tmp_path_factory):
    ports = [free_port() for _ in range(3)]

    def edit(config):
        set_port(config, ports)
        config['executors'][0]['uses']['with'].update(max_image_bytes=MAX_IMAGE_BYTES)

    flow = flow_from_yaml('multi-protocol.yml', tmp_path_factory.mktemp('flow'), edit, {'CLIPSERVE_MODEL': TINY})
    with flow:
        yield ports[1]


def test_embedding_through_a_running_flow_gives_the_local_engines_rows(collection, local, http_port, tmp_path):
    out = tmp_path / 'served'
    run_embed(
        collection,
        '--output',
        out,
        '--server',
        f'http://127.0.0.1:{http_port}',
        '--batch-size',
        '5',
        '--workers',
        '1',
        '--quiet',
    )
    served = read_output(out)
    large = str(collection / 'large.png')
    # the local engine embeds the large image; the server refuses it by its own limit: a row error, the rest kept
    keep = [i for i, path in enumerate(local['metadata']['image_path']) if path != large]
    expected = local['metadata'].iloc[keep].reset_index(drop=True)
    assert served['metadata'][['image_path', 'caption', 'position', 'width', 'height']].equals(
        expected[['image_path', 'caption', 'position', 'width', 'height']]
    )
    assert cosines(served['img'], local['img'][keep]).min() > 0.9999
    assert cosines(served['text'], local['text'][keep]).min() > 0.9999
    errors = served['errors'].set_index('image_path')['error']
    assert errors[str(collection / 'corrupt.jpg')] == local['errors']['error'][0]  # found before sending
    assert 'the server refused it' in errors[large] and f'{MAX_IMAGE_BYTES} bytes' in errors[large]


def test_an_unreachable_server_stops_the_run_saying_so(collection, tmp_path):
    result = run_embed(
        collection, '--output', tmp_path / 'out', '--server', f'http://127.0.0.1:{free_port()}', check=False
    )
    assert result.returncode == 2
    assert 'is unavailable: ConnectError' in result.stderr and 'gave up after 2 attempt(s)' in result.stderr


@pytest.fixture(scope='module')
def file_server(collection):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(collection))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()


def test_url_inputs_follow_the_uri_policy_and_fail_per_row(collection, local, file_server, tmp_path):
    listing = tmp_path / 'urls.txt'
    closed = f'http://127.0.0.1:{free_port()}/img_001.jpg'
    listing.write_text(f'{file_server}/img_004.jpg\tpicture four\n{file_server}/gone.jpg\tgone\n{closed}\tclosed\n')
    args = [str(listing), '--model', TINY, '--workers', '0', '--quiet', '--remote-timeout', '5']
    refused = embed([*args, '--output', str(tmp_path / 'refused')])
    assert (refused['embedded'], refused['errors']) == (0, 3)
    assert 'non-public address' in read_output(tmp_path / 'refused')['errors']['error'][0]
    summary = embed([*args, '--output', str(tmp_path / 'allowed'), '--allow-host', '127.0.0.1'])
    assert (summary['embedded'], summary['errors']) == (1, 2)
    data = read_output(tmp_path / 'allowed')
    assert data['metadata']['url'][0] == f'{file_server}/img_004.jpg' and data['metadata']['image_path'].isna().all()
    row = list(local['metadata']['image_path']).index(str(collection / 'img_004.jpg'))
    assert cosines(data['img'], local['img'][[row]])[0] > 0.9999
    errors = list(data['errors']['error'])
    assert 'HTTP 404' in errors[0] and 'cannot connect' in errors[1]
    assert np.all(data['errors']['url'].notna())
