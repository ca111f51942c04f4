"""The code rules CI enforces: ruff's lint and format (pyproject.toml [tool.ruff]) and the import contracts of the
layers (pyproject.toml [tool.importlinter]: models -> backends -> ranking/pipeline -> executors; the
client imports nothing of the server; nothing below the executors imports Jina or DocArray)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_lint_passes():
    result = subprocess.run(
        [BIN / 'ruff', 'check', 'executors', 'client', 'tests', 'benchmarks', 'fuzz'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_ruff_format_is_applied():
    """`ruff format` (pyproject.toml [tool.ruff.format]) leaves every file as it is."""
    result = subprocess.run(
        [BIN / 'ruff', 'format', '--check', 'executors', 'client', 'tests', 'benchmarks', 'fuzz'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_import_contracts_hold():
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'executors'), str(ROOT / 'client')])}
    result = subprocess.run(
        [BIN / 'lint-imports', '--no-cache'], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
