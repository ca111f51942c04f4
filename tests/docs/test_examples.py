"""The README's and the docs' code blocks, run against real Flows (the harness: docs/development.md).

Each test is one marked block (with the `continue` blocks after it), run in docs_workdir against the Flow its
marker names, its ports and model names rewritten to the Flow's. Python runs in this process, bash under
`bash -e -o pipefail` with this interpreter's bin folder first on the PATH. A block fails its test when it
raises, exits non-zero, or its output lacks the marker's `expect` text.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT, runnable_chains

CHAINS = runnable_chains()
BASH_SECONDS = 180


def _env() -> dict:
    path = [str(Path(sys.executable).parent), os.environ.get('PATH', '')]
    pythonpath = [str(ROOT / 'client'), os.environ.get('PYTHONPATH', '')]
    return {**os.environ, 'PATH': os.pathsep.join(path), 'PYTHONPATH': os.pathsep.join(p for p in pythonpath if p)}


def run_python(code: str, namespace: dict, where: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, 'exec'), namespace)
    return out.getvalue()


def run_bash(code: str, cwd: Path, where: str) -> str:
    done = subprocess.run(
        ['bash', '-e', '-o', 'pipefail', '-c', code],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=BASH_SECONDS,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f'{where} exited {done.returncode}:\n{code}\n---\n{output[-4000:]}'
    return output


@pytest.mark.parametrize('head', CHAINS, ids=[c.where for c in CHAINS])
def test_example_runs(head, doc_flow, docs_workdir, monkeypatch):
    if str(ROOT / 'client') not in sys.path:
        monkeypatch.syspath_prepend(str(ROOT / 'client'))  # the client from the tree where it is not installed
    cwd = ROOT if head.marker.in_repo else docs_workdir
    monkeypatch.chdir(cwd)
    flow = doc_flow(head.marker.flow)
    namespace = {'__name__': '__doc_example__'}
    for block in head.chain:
        code = flow.rewrite(block.code)
        if block.language == 'python':
            output = run_python(code, namespace, block.where)
        else:
            output = run_bash(code, cwd, block.where)
        if block.marker.expect is not None:
            expected = flow.rewrite(block.marker.expect)
            assert expected in output, f'{block.where}: {expected!r} not in the output:\n{output[-4000:]}'
