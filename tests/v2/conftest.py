"""The DocArray v2 tests: run inside the v2 environment (.venv-v2, constraints-v2.txt), which
tests/test_docarray_v2.py builds and runs them in; the main (v1) environment collects nothing here.

They need an ONNX export of the tiny model and the v1 Flow's embeddings for it (tests/v2/inputs.py: the
runner makes both, as the v2 environment has no torch); run by hand:
    CLIPSERVE_V2_EXPORT=DIR CLIPSERVE_V2_REFERENCE=FILE.npz .venv-v2/bin/python -m pytest tests/v2
TLS: clients trust only the certificate made here (the build machines point gRPC and OpenSSL at the system
bundle through GRPC_DEFAULT_SSL_ROOTS_FILE_PATH and SSL_CERT_FILE: these and requests' REQUESTS_CA_BUNDLE are
set before any channel exists).
"""

import contextlib
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

V2 = int(metadata.version('docarray').split('.')[1]) >= 30 if metadata.version('docarray').startswith('0.') else True
collect_ignore_glob = [] if V2 else ['test_*.py']  # the v1 environment: nothing to run here
CI = os.environ.get('CI', '').lower() == 'true'
TOKEN = 'v2-s3cret'


def _certificate() -> tuple[Path, Path]:
    folder = Path(tempfile.mkdtemp(prefix='clipserve-v2-tls-'))
    cert, key = folder / 'cert.pem', folder / 'key.pem'
    subprocess.run(
        ['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', str(key), '-out', str(cert)]
        + ['-days', '2', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1'],
        check=True,
        capture_output=True,
    )
    return cert, key


TLS_VARIABLES = ('GRPC_DEFAULT_SSL_ROOTS_FILE_PATH', 'SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE')
MACHINE_TLS = {k: os.environ[k] for k in TLS_VARIABLES if k in os.environ}  # for pip: package registries

if V2:
    CERT, KEY = _certificate()
    os.environ['GRPC_DEFAULT_SSL_ROOTS_FILE_PATH'] = str(CERT)
    os.environ['SSL_CERT_FILE'] = str(CERT)
    os.environ['REQUESTS_CA_BUNDLE'] = str(CERT)  # requests reads certifi's bundle otherwise


@pytest.fixture(scope='session')
def export_dir() -> Path:
    from .inputs import EXPORT_ENV, REFERENCE_ENV

    found = os.environ.get(EXPORT_ENV)
    if not found or not os.environ.get(REFERENCE_ENV):
        reason = f'{EXPORT_ENV} and {REFERENCE_ENV} are not set: run tests/test_docarray_v2.py, which sets them'
        pytest.fail(reason) if CI else pytest.skip(reason)
    return Path(found)


@pytest.fixture(scope='session')
def reference(export_dir):
    from .inputs import reference

    return reference()


@pytest.fixture(scope='session')
def image_folder(tmp_path_factory) -> Path:
    """The test images as files, for the file-URL input kind (allow_local_files under this folder)."""
    from .inputs import IMAGES

    folder = tmp_path_factory.mktemp('images')
    for i, data in enumerate(IMAGES):
        (folder / f'image-{i}.png').write_bytes(data)
    return folder


@contextlib.contextmanager
def environment(values: dict):
    """Variables for a Flow's whole life: its processes read the executors' settings when they start."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def shipped_flow(name: str, folder: Path, export: Path, ports: list[int], env: dict | None = None, edit=None):
    """flows/NAME on `ports` (gRPC, HTTP, WebSocket) with the tiny model's export, for as long as the block runs."""
    from tests.integration.conftest import flow_from_yaml, set_port

    from .inputs import TINY

    def change(config):
        set_port(config, ports)
        if edit:
            edit(config)

    values = {
        'CLIPSERVE_MODEL': TINY,
        'CLIPSERVE_MODEL_PATH': str(export),
        **{k: str(v) for k, v in (env or {}).items()},
    }
    with environment(values):
        flow = flow_from_yaml(name, folder, change, values)
        with flow:
            yield flow
