"""Jina's Kubernetes / docker-compose exports of the shipped Flows, validated offline against the Kubernetes
schemas (kubernetes-validate) and the Compose specification (check-jsonschema's vendored compose-spec), and
the README's patches and policies applied to them.
"""

import copy
from pathlib import Path

import pytest
import yaml

from .deploy_helpers import BIN, IMAGE, ROOT, run

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
CUSTOM_GATEWAY_FLOWS = {'auth.yml', 'secure-v2.yml'}  # secure-v2.yml: auth.yml's gateway, DocArray v2
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
