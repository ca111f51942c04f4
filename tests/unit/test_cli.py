"""`python -m clipserve FLOW` finds the shipped Flows from a checkout and from a wheel install."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from clipserve import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / 'flows').glob('*.yml'))


def test_a_bare_name_finds_the_shipped_flow_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.find_flow('onnx.yml').resolve() == (ROOT / 'flows' / 'onnx.yml').resolve()
    with pytest.raises(SystemExit, match='no Flow file'):
        cli.find_flow('nonexistent.yml')


def test_a_wheel_install_finds_them_under_its_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, 'SOURCE_FLOWS', tmp_path / 'no-checkout')
    monkeypatch.setattr(sys, 'prefix', str(tmp_path / 'venv'))
    installed = tmp_path / 'venv' / cli.INSTALLED_FLOWS
    installed.mkdir(parents=True)
    (installed / 'torch.yml').write_text('jtype: Flow\n')
    assert cli.find_flow('torch.yml') == installed / 'torch.yml'


def test_the_wheel_carries_every_shipped_flow_where_the_cli_looks(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            '-m',
            'pip',
            'wheel',
            '--no-deps',
            '--no-build-isolation',
            '-q',
            '-w',
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [wheel] = tmp_path.glob('clipserve-*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    data = sorted(Path(n).name for n in names if f'.data/data/{cli.INSTALLED_FLOWS.as_posix()}/' in n)
    assert data == SHIPPED
