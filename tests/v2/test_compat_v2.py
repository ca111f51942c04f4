"""The door's DocArray v2 section (serving/jina/compat.py) and the flavour check (serving/jina/flavour.py).

- Jina 3.34's gateway models fail with pydantic >= 2.11 unless `pydantic.create_model` turns their v1-style
  config classes into ConfigDicts; the wrapper changes nothing else. Checked here on the installed pydantic
  (constraints-v2.txt: the newest) and, through a real HTTP + WebSocket Flow, on the last release of every
  minor version from 2.10 (pip-installed into a folder put first on the path; the HTTP and WebSocket Flows
  of the other tests run on the installed one).
- Importing clipserve with docarray v2 and pydantic 1, or clip-client's docarray, fails naming both installs.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pydantic
import pytest
from pydantic import BaseConfig, BaseModel, ConfigDict

from clipserve.serving.jina import flavour
from clipserve.serving.jina.compat import install_pydantic_compat

from .conftest import CI, MACHINE_TLS, TLS_VARIABLES

MINOR = int(pydantic.VERSION.split('.')[1])
# the last release of each pydantic 2 minor version Jina's HTTP gateway is checked with (2.14: constraints-v2.txt)
PYDANTIC_RELEASES = ['2.10.6', '2.11.10', '2.12.5', '2.13.5']


class V1Config(BaseConfig):
    use_enum_values = True
    allow_population_by_field_name = True


def test_jinas_gateway_models_import_only_with_the_wrapper():
    code = 'import jina.serve.runtimes.gateway.models'
    bare = subprocess.run([sys.executable, '-W', 'ignore', '-c', code], capture_output=True, text=True, timeout=120)
    if MINOR >= 11:
        assert bare.returncode != 0 and "'_ConfigMetaclass' object is not iterable" in bare.stderr
    fixed = f'from clipserve.serving.jina.compat import install_pydantic_compat as i; i(); {code}; print("ok")'
    done = subprocess.run([sys.executable, '-W', 'ignore', '-c', fixed], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == 'ok', done.stderr[-2000:]


def test_the_wrapper_converts_v1_config_classes_and_nothing_else():
    assert install_pydantic_compat() == (MINOR >= 11)
    if MINOR < 11:
        pytest.skip(f'pydantic {pydantic.VERSION} takes config classes itself: nothing is wrapped')
    create = pydantic.create_model
    assert create.__wrapped__ is not create
    with pytest.raises(TypeError, match='_ConfigMetaclass'):
        create.__wrapped__('Bare', x=(int, 1), __config__=V1Config)
    model = create('Wrapped', color=(str, 'red'), __config__=V1Config)
    assert model.model_config.get('use_enum_values') is True
    assert model.model_config.get('validate_by_name', model.model_config.get('populate_by_name')) is True
    plain = create('Plain', x=(int, 1), __config__=ConfigDict(frozen=True))
    assert plain.model_config == {'frozen': True}
    assert create('Based', __base__=BaseModel, x=(int, 2))().x == 2
    assert install_pydantic_compat() and pydantic.create_model is create  # installed once


@pytest.mark.parametrize(
    'versions, wrong',
    [
        (('0.41.0', '1.10.27', None), 'needs pydantic 2'),
        (('0.21.1', '2.14.4', None), 'needs pydantic 1'),
        (('0.35.0', '2.14.4', None), 'docarray >= 0.40'),
        (('0.41.0', '2.14.4', '0.8.3'), 'clip-client 0.8.3'),
    ],
)
def test_wrong_combinations_are_named(versions, wrong):
    reason = flavour.problem(*versions)
    assert wrong in reason
    text = flavour.message(reason)
    assert flavour.INSTALL_V1 in text and flavour.INSTALL_V2 in text
    assert flavour.problem('0.41.0', '2.14.4') is None and flavour.problem('0.21.1', '1.10.27') is None


def test_importing_clipserve_with_pydantic_1_metadata_fails_naming_both_installs():
    code = textwrap.dedent("""
        import importlib.metadata as m
        real = m.version
        m.version = lambda name: '1.10.27' if name == 'pydantic' else real(name)
        import jina
        import clipserve
    """)
    done = subprocess.run([sys.executable, '-W', 'ignore', '-c', code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and 'FlavourError' in done.stderr, done.stderr[-2000:]
    assert flavour.INSTALL_V1 in done.stderr and flavour.INSTALL_V2 in done.stderr


FLOW = """
import sys
import pydantic
from docarray import DocList
from jina import Client, Flow
import clipserve
from clipserve.serving.schemas import ClipDoc
assert pydantic.VERSION == sys.argv[1], pydantic.VERSION
ports = [int(p) for p in sys.argv[2:4]]
flow = Flow(protocol=['http', 'websocket'], port=ports).add(
    uses=clipserve.CLIPEncoder, uses_with={'name': 'clipserve-tiny::random', 'backend': 'onnx', 'model_path': sys.argv[4]}
)
with flow:
    for protocol, port in zip(['http', 'websocket'], ports):
        out = Client(host='127.0.0.1', port=port, protocol=protocol).post(
            '/encode', DocList[ClipDoc]([ClipDoc(text='a dog')]), return_type=DocList[ClipDoc]
        )
        assert len(out[0].embedding) == 64
print('served with pydantic', pydantic.VERSION)
"""


@pytest.mark.parametrize('release', PYDANTIC_RELEASES)
def test_http_and_websocket_flows_with_each_pydantic_minor(release, export_dir):
    from tests.integration.conftest import free_port

    folder = Path(sys.prefix) / f'pydantic-{release}'  # kept with the environment: rebuilt with it
    if not (folder / '.complete').is_file():
        pip = [sys.executable, '-m', 'pip', 'install', '-q', '--target', str(folder), f'pydantic=={release}']
        registry_env = {k: v for k, v in os.environ.items() if k not in TLS_VARIABLES} | MACHINE_TLS
        done = subprocess.run(pip, env=registry_env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            reason = f'cannot install pydantic {release}: {done.stderr[-1000:]}'
            pytest.fail(reason) if CI else pytest.skip(reason)
        (folder / '.complete').write_text('ok\n')
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [str(folder), os.environ.get('PYTHONPATH')]))}
    args = [release, str(free_port()), str(free_port()), str(export_dir)]
    done = subprocess.run(
        [sys.executable, '-W', 'ignore', '-c', FLOW, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert f'served with pydantic {release}' in done.stdout, (done.stdout + done.stderr)[-4000:]
