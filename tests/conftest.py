"""Shared fixtures. The tiny architecture keeps model-dependent tests fast; real ones use ViT-B-32::random."""

import os

import pytest

from .certificates import self_signed

os.environ.setdefault('NO_VERSION_CHECK', '1')  # clip-client's PyPI check
os.environ.setdefault('JINA_OPTOUT_TELEMETRY', '1')  # no calls home from test Flows
os.environ.setdefault('JINA_LOG_LEVEL', 'WARNING')
# Tests run torch in this process and then start Flows; forking after OpenMP has started can hang
# the child (libgomp is not fork-safe), so executors start in fresh interpreters.
os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')


def _above_ephemeral_ports() -> int:
    """The first port above the kernel's range for outgoing connections' source ports. A port handed out
    below it can be taken, between being chosen and being bound, by any connection's source port (or by
    a connection to itself while the server is not up yet): the server then never listens, after Jina
    has already called its pod ready. Seen in CI as a shard refusing every connection."""
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            upper = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 61000
    return upper + 1 if upper < 64000 else 49153


FIRST_FREE_PORT = _above_ephemeral_ports()
# Above the ephemeral range, two halves that never meet: Jina's own ports for heads and executors below
# TESTS_FIRST_PORT, the ports the tests choose for gateways (integration/conftest.py free_port) from it up.
# Sharing one range, Jina could hand an executor the port a test had chosen for the gateway and not yet
# bound (seen in CI: a gateway's "address already in use" now and then, a different test each run).
TESTS_FIRST_PORT = (FIRST_FREE_PORT + 65535) // 2
os.environ.setdefault('JINA_RANDOM_PORT_MIN', str(FIRST_FREE_PORT))
os.environ.setdefault('JINA_RANDOM_PORT_MAX', str(TESTS_FIRST_PORT - 1))

# dtype 'auto' on a CPU means bf16 images where the CPU has bf16 instructions (some CI machines do, some
# not). The suite's parity checks compare against open_clip in fp32, so by default it runs as on a CPU
# without them; the tests of the bf16 default force the detection each way (CLIPSERVE_CPU_BF16).
os.environ.setdefault('CLIPSERVE_CPU_BF16', '0')

TINY = 'clipserve-tiny::random'
TINY_EXPORT_ENV = 'CLIPSERVE_TEST_TINY_EXPORT'  # an ONNX export of TINY made beforehand (the emulated-CPU run)

# A Flow YAML's `py_modules: [clipserve.serving]` finds CLIPEncoder only if the package defined it with Jina already
# imported (clipserve/__init__.py); tests import clipserve's modules first, so Jina is imported before them.
if not os.environ.get(TINY_EXPORT_ENV):  # the emulated-CPU run starts no Flow
    import jina  # noqa: E402, F401


@pytest.fixture(scope='session')
def tiny_backend():
    from clipserve.backends import BackendOptions, create_backend

    return create_backend('torch', TINY, BackendOptions(device='cpu'))


@pytest.fixture(scope='session')
def tiny_onnx_export(tmp_path_factory):
    """The tiny model's ONNX export, made once per session; the emulated-CPU run is handed one made natively
    (exporting runs torch, which needs no emulation and takes minutes under it)."""
    from pathlib import Path

    if os.environ.get(TINY_EXPORT_ENV):
        return Path(os.environ[TINY_EXPORT_ENV])
    from clipserve.backends.onnx.export import export_onnx

    out = tmp_path_factory.mktemp('tiny-onnx')
    export_onnx(TINY, out)
    return out


@pytest.fixture(scope='session')
def certificate(tmp_path_factory):
    """A self-signed certificate for localhost and 127.0.0.1, made at test time: (cert.pem, key.pem)."""
    return self_signed(tmp_path_factory.mktemp('tls'), 'localhost', 'DNS:localhost,IP:127.0.0.1')


@pytest.fixture(scope='session')
def tls_flow(certificate, tmp_path_factory):
    """flows/tls.yml on free ports with the tiny model: {'grpc': port, 'http': port, 'websocket': port}."""
    from tests.integration.conftest import flow_from_yaml, free_port, set_port

    protocols = ['grpc', 'http', 'websocket']
    ports = [free_port() for _ in protocols]
    cert, key = certificate
    flow = flow_from_yaml(
        'tls.yml',
        tmp_path_factory.mktemp('flows'),
        lambda c: set_port(c, ports),
        {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_TLS_CERT': str(cert), 'CLIPSERVE_TLS_KEY': str(key)},
    )
    with flow:
        yield dict(zip(protocols, ports))


@pytest.fixture(scope='session')
def family_folder(tmp_path_factory):
    """family -> its shrunk local-dir folder (devkit/model_folders.py), built once per session."""
    from devkit.model_folders import FAMILIES

    built = {}

    def get(family):
        if family not in built:
            built[family] = FAMILIES[family](tmp_path_factory.mktemp('families') / family)
        return built[family]

    return get


@pytest.fixture(scope='session')
def family_export(family_folder, tmp_path_factory):
    """family -> (its clipserve ONNX export folder, the export's metadata), exported once per session."""
    built = {}

    def get(family):
        if family not in built:
            from clipserve.backends.onnx.export import export_onnx

            out = tmp_path_factory.mktemp('family-exports') / family
            built[family] = out, export_onnx(f'local-dir:{family_folder(family)}', out)
        return built[family]

    return get


def pytest_report_header(config):
    from clipserve.backends.cpu_features import cpu_features

    return f'clipserve CPU: {cpu_features().describe()}'


def pytest_collection_modifyitems(config, items):
    """`needs_cpu(*flags)`: skipped, with the reason shown in the summary, where the CPU lacks a flag."""
    from clipserve.backends.cpu_features import cpu_features

    features = cpu_features()
    for item in items:
        for marker in item.iter_markers('needs_cpu'):
            missing = [flag for flag in marker.args if flag not in features.flags]
            if missing:
                item.add_marker(pytest.mark.skip(reason=f'needs {", ".join(missing)}; this CPU: {features.describe()}'))
