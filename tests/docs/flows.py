"""The Flows the doc examples run against: shipped flows/*.yml with the tiny model on free ports.

One Flow runs at a time (CI has 2 cores): `FlowPool.use(name)` stops the one running when another is asked
for. The blocks are sorted by Flow (blocks.runnable_chains), so each Flow starts once per session. `tls` is
tests/conftest.py's session fixture `tls_flow` (shared with the client tests), started by the caller.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.conftest import ROOT, TINY, flow_from_yaml, free_port, set_port

# a second tiny model with another name (multi-model Flows need two): the bundled architecture by its file
TINY_FILE = f'{ROOT / "executors" / "clipserve" / "models" / "configs" / "clipserve-tiny.json"}::random'
TOKEN = 's3cret'
MODELS = {'ViT-B-32::openai': TINY, 'ViT-L-14::openai': TINY_FILE}
DOC_PORTS = (51000, 51001, 51002)
DOC_METRICS_PORTS = (9090, 9091)
PORT = re.compile(r'(?<![\d.])(51000|51001|51002|9090|9091)(?!\d)')


@dataclass
class Running:
    name: str
    ports: dict[int, int]  # the port a doc names -> the port the Flow listens on
    models: dict[str, str] = field(default_factory=lambda: dict(MODELS))
    env: dict[str, str | None] = field(default_factory=dict)  # the variables' values before the Flow started
    flow: object = None

    def rewrite(self, text: str) -> str:
        text = PORT.sub(lambda m: str(self.ports.get(int(m.group(1)), m.group(1))), text)
        for documented, served in self.models.items():
            text = text.replace(documented, served)
        return text


def _monitoring(config, ports):
    config['gateway']['port'] = ports[51000]
    config['with']['port_monitoring'] = ports[9090]
    config['executors'][0]['port_monitoring'] = ports[9091]


def _multi_model(config, ports):
    set_port(config, [ports[51000], ports[51001]])
    for executor in config['executors']:
        arguments = executor['uses']['with']
        arguments['name'] = MODELS.get(arguments['name'], arguments['name'])
        arguments['served_models'] = [MODELS.get(m, m) for m in arguments['served_models']]


# name -> (file, documented ports it serves, edit(config, ports), extra environment)
FLOWS = {
    'multi-protocol': ('multi-protocol.yml', DOC_PORTS, lambda c, p: set_port(c, [p[n] for n in DOC_PORTS]), {}),
    'auth': (
        'auth.yml',
        DOC_PORTS,
        lambda c, p: set_port(c, [p[n] for n in DOC_PORTS]),
        {'CLIPSERVE_AUTH_TOKEN': TOKEN},
    ),
    'multi-model': ('multi-model.yml', DOC_PORTS[:2], _multi_model, {}),
    'monitoring': ('monitoring.yml', (51000, *DOC_METRICS_PORTS), _monitoring, {}),
    'search': ('search.yml', DOC_PORTS, lambda c, p: set_port(c, [p[n] for n in DOC_PORTS]), {}),
    'rerank': (
        'rerank.yml',
        DOC_PORTS,
        lambda c, p: set_port(c, [p[n] for n in DOC_PORTS]),
        {'CLIPSERVE_RERANK_DTYPE': 'fp32'},
    ),
}
RERANKER = 'BAAI/bge-reranker-v2-m3'  # what the docs name; the doc tests serve a tiny reranker built here in its place
# the README's own servers, started with the command the README shows, verbatim (its ports, its model):
# name -> what tells its command from the others (the step-1 server has no index)
README_SERVERS = {'readme': lambda words: '--index' not in words, 'readme-search': lambda words: '--index' in words}
README_HTTP = 51001


def readme_command(name: str) -> list[str]:
    """The `clipserve serve` command of the README that the server `name` is, as a user types it."""
    import shlex

    from tests.docs.blocks import read_blocks

    found = []
    for block in read_blocks(ROOT / 'README.md'):
        for line in block.code.splitlines():
            at = line.split('#')[0].find('.venv/bin/clipserve serve')
            if at >= 0:
                words = shlex.split(line.split('#')[0][at:])
                if README_SERVERS[name](words):
                    found.append(words)
    assert len(found) == 1, f'README.md: {len(found)} `.venv/bin/clipserve serve` commands for {name}: {found}'
    return found[0]


class ReadmeServer:
    """The README's command, run in the repository's root as the README says (`.venv/bin/clipserve`: the test
    environment's own command where the checkout's .venv is not the one running the tests)."""

    def __init__(self, name: str, log: Path):
        import subprocess
        import sys

        words = readme_command(name)
        if not (ROOT / words[0]).is_file():
            words[0] = str(Path(sys.executable).parent / 'clipserve')
        self.words, self.log = words, log
        self.process = subprocess.Popen(
            words, cwd=ROOT, stdout=open(log, 'a'), stderr=subprocess.STDOUT, start_new_session=True
        )

    def start(self) -> None:
        import requests

        from tests.integration.conftest import stop_process, wait_for

        def ready() -> bool:
            assert self.process.poll() is None, f'{" ".join(self.words)} exited:\n{self.log.read_text()[-3000:]}'
            try:
                return requests.get(f'http://127.0.0.1:{README_HTTP}/readyz', timeout=2).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_for(ready, 300, f"the README's server ({' '.join(self.words)})")
        except BaseException:
            stop_process(self.process)
            raise

    def close(self) -> None:
        import shutil

        from tests.integration.conftest import stop_process

        stop_process(self.process)
        if '--index' in self.words:  # the README's index folder, made in the checkout: not left behind
            shutil.rmtree(ROOT / self.words[self.words.index('--index') + 1], ignore_errors=True)


class FlowPool:
    def __init__(self, directory: Path):
        self.directory = directory
        self.running: Running | None = None

    def use(self, name: str) -> Running:
        if self.running is not None and self.running.name == name:
            return self.running
        self.close()
        if name in README_SERVERS:
            server = ReadmeServer(name, self.directory / f'{name}.log')
            server.start()
            self.running = Running(name, {}, models={}, flow=server)  # verbatim: its ports and model names
            return self.running
        if name not in FLOWS:
            raise KeyError(f'no doc-test Flow {name!r}; known: {", ".join([*FLOWS, *README_SERVERS])}, tls')
        file, documented, edit, env = FLOWS[name]
        models = dict(MODELS)
        if name == 'rerank':
            from tests.transformers_folders import cross_encoder_checkpoint

            folder = self.directory / 'bge-reranker-v2-m3'
            if not (folder / 'config.json').is_file():
                cross_encoder_checkpoint(folder)
            env = {**env, 'CLIPSERVE_RERANK_MODEL': str(folder)}
            models[RERANKER] = str(folder)
        ports = {port: free_port() for port in documented}
        # a search Flow's index in a folder of this session's (every Flow gets one; only CLIPIndexer reads it)
        env = {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_INDEX_PATH': str(self.directory / f'{name}-index'), **env}
        flow = flow_from_yaml(file, self.directory, lambda config: edit(config, ports), env)
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)  # a gateway reads its token when it starts, in its own process
        try:
            flow.start()
        except BaseException:
            _restore(saved)
            raise
        self.running = Running(name, ports, models=models, env=saved, flow=flow)
        return self.running

    def close(self) -> None:
        if self.running is not None and self.running.flow is not None:
            try:
                self.running.flow.close()
            finally:
                _restore(self.running.env)
        self.running = None


def _restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
