"""Static checks of the docs' and the README's code blocks and text, skipped blocks included.

Every runnable block of a page the docs own carries a marker; what a block names must exist: Flow files,
CLIPSERVE_* variables, `python -m clipserve` subcommands and options; the repository paths the pages cite
exist; YAML Flows load; the README stays a front page whose test command is CI's.
"""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from tests.docs.blocks import ROOT, RUNNABLE_LANGUAGES, all_blocks, owned, pages, read_blocks, runnable_chains
from tests.docs.flows import FLOWS, README_SERVERS

sys.path.insert(0, str(ROOT / 'docs' / 'hooks'))

from docgen import cli, settings  # noqa: E402

BLOCKS = all_blocks()
OWN_RUNNABLE = [b for b in BLOCKS if owned(b.path) and b.language in RUNNABLE_LANGUAGES]
FLOW_FILE = re.compile(r'flows/([\w.-]+\.yml)')
VARIABLE = re.compile(r'\bCLIPSERVE_[A-Z0-9_]*[A-Z0-9]\b')
# a repository path: a file with its extension, or a folder with its trailing slash (not docs/s, a rate)
REPO_PATH = re.compile(
    r'(?<![\w/.-])((?:tests|benchmarks|deploy|executors|flows|client|fuzz|docs)/(?:[\w.-]+/)*(?:[\w-]+\.\w+)?)'
)
CLI_CALL = re.compile(r'(?:python -m |bin/|^\s*|[;&|(]\s*)clipserve ((?:[a-z][\w-]* ?)*)(.*)')  # the command line
LIMIT = 250
PLACEHOLDER = re.compile(r'\b[A-Z]{3,}\b')  # flows/NAME.yml, --build-arg VARIANT
GENERATED = ('benchmarks/results/', 'fuzz/findings')  # written by the benchmarks and the fuzzer, not committed


def ids(blocks):
    return [b.where for b in blocks]


@pytest.mark.parametrize('block', OWN_RUNNABLE, ids=ids(OWN_RUNNABLE))
def test_every_runnable_block_says_how_it_is_tested(block):
    assert block.marker is not None, f'{block.where}: add <!-- test: flow=NAME | local | skip: REASON --> above it'
    if block.marker.kind == 'skip':
        assert len(block.marker.reason) > 10, f'{block.where}: a skip says why and what covers it'


def test_markers_name_known_flows_and_chain_properly():
    chains = runnable_chains()  # raises on a `continue` without a block before it
    known = set(FLOWS) | set(README_SERVERS) | {'tls'}
    assert {c.marker.flow for c in chains if c.marker.flow} <= known
    assert len(chains) >= 25


def _variables() -> set[str]:
    known = {v for v, _, _ in settings.variable_rows()}
    compose = (ROOT / 'deploy' / 'compose.yml').read_text(encoding='utf-8')
    return known | set(VARIABLE.findall(compose)) | {'CLIPSERVE_DOCS_PYTHON'}


@pytest.mark.parametrize('block', BLOCKS, ids=ids(BLOCKS))
def test_what_a_block_names_exists(block):
    for name in FLOW_FILE.findall(block.code):
        assert (ROOT / 'flows' / name).is_file(), f'{block.where}: flows/{name} does not exist'
    unknown = set(VARIABLE.findall(block.code)) - _variables()
    assert not unknown, f'{block.where}: no code reads {sorted(unknown)}'
    for line in block.code.splitlines():
        call = CLI_CALL.search(line.split('#')[0])
        if call:
            _check_cli(block, call.group(1).split(), call.group(2))


def _check_cli(block, words, rest):
    commands = {tuple(w) for w in cli.subcommands()}
    command = max(
        (c for c in commands if tuple(words[: len(c)]) == c), key=len, default=('serve',)
    )  # no command: serve
    parser = cli.parser_of(command)
    flags = {s for action in parser._actions for s in action.option_strings}
    for flag in re.findall(r'(?<![\w-])(--?[a-z][\w-]*)', rest):
        assert flag in flags, f'{block.where}: clipserve {" ".join(command)} has no option {flag}'


@pytest.mark.parametrize('block', [b for b in BLOCKS if b.marker and b.marker.kind == 'yaml-flow'], ids=str)
def test_yaml_flows_load(block, tmp_path):
    from jina import Flow

    path = tmp_path / 'flow.yml'
    path.write_text(block.code)
    assert yaml.safe_load(block.code)['jtype'] == 'Flow'
    Flow.load_config(str(path))


@pytest.mark.parametrize('page', [p for p in pages() if owned(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_paths_a_page_cites_exist(page):
    text = page.read_text(encoding='utf-8')
    cited = {p for p in REPO_PATH.findall(text) if '*' not in p and not PLACEHOLDER.search(p)}
    missing = sorted(p for p in cited if not p.startswith(GENERATED) and not (ROOT / p).exists())
    assert not missing, f'{page.relative_to(ROOT)} cites {missing}'


def test_the_readme_is_a_front_page():
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    assert len(text.splitlines()) <= LIMIT
    assert 'A Flow without a token is open to anyone who can reach it' in text
    assert 'flows/auth.yml' in text and 'CLIPSERVE_AUTH_TOKEN' in text
    python = [b for b in read_blocks(ROOT / 'README.md') if b.language == 'python']
    imports = ' '.join(b.code for b in python)
    for client in ('from clip_client import', 'from clipserve_client import', 'from openai import'):
        assert client in imports, client


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line for line in (ROOT / '.ci' / 'run').read_text().splitlines() if 'pytest' in line]
    readme = [b.code for b in read_blocks(ROOT / 'README.md') if b.language == 'bash']
    assert ci and any(ci[-1] in code.splitlines() for code in readme), "the README must show .ci/run's command verbatim"
