"""Fixtures of the docs' tests: a scratch folder with the files the examples name, and the Flows they use."""

import shutil

import pytest

from tests.docs.flows import DOC_PORTS, FlowPool, Running
from tests.integration.conftest import make_image


@pytest.fixture(scope='session')
def docs_workdir(tmp_path_factory):
    """The folder examples run in: dog.jpg, cat.png, photo.jpg, car.jpg, photos/dog.jpg, photos/cat.png."""
    folder = tmp_path_factory.mktemp('doc-examples')
    (folder / 'photos').mkdir()
    for name, seed, fmt in (('dog.jpg', 1, 'JPEG'), ('photo.jpg', 2, 'JPEG'), ('car.jpg', 3, 'JPEG')):
        (folder / name).write_bytes(make_image(640, 480, seed=seed, fmt=fmt))
    (folder / 'cat.png').write_bytes(make_image(320, 240, seed=4))
    shutil.copy(folder / 'dog.jpg', folder / 'photos' / 'dog.jpg')
    shutil.copy(folder / 'cat.png', folder / 'photos' / 'cat.png')
    return folder


@pytest.fixture(scope='module')
def flow_pool(tmp_path_factory):
    pool = FlowPool(tmp_path_factory.mktemp('doc-flows'))
    yield pool
    pool.close()


@pytest.fixture
def doc_flow(request, flow_pool, docs_workdir):
    """use(name) -> Running: the named Flow, started if it is not the one running."""

    def use(name: str | None) -> Running:
        if name is None:
            return Running('local', {})
        if name == 'tls':
            flow_pool.close()
            ports = request.getfixturevalue('tls_flow')
            cert, _ = request.getfixturevalue('certificate')
            shutil.copy(cert, docs_workdir / 'cert.pem')
            return Running('tls', dict(zip(DOC_PORTS, (ports['grpc'], ports['http'], ports['websocket']))))
        return flow_pool.use(name)

    return use
