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
    assert 'clipserve/static/playground.html' in names  # the gateway's /playground page


def test_models_lists_every_pretrained_pair_with_its_facts(capsys):
    import json

    import open_clip

    cli.main(['models', '--json'])
    rows = {row['name']: row for row in json.loads(capsys.readouterr().out)}
    pairs = [f'{arch}::{tag}' for arch, tag in open_clip.list_pretrained()]
    assert len(pairs) >= 190 and not set(pairs) - set(rows)
    siglip = rows['ViT-B-16-SigLIP::webli']
    assert (siglip['family'], siglip['tokenizer'], siglip['context_length']) == ('SigLIP', 'timm/ViT-B-16-SigLIP', 64)
    assert (siglip['embed_dim'], siglip['image_size'], siglip['resize_mode']) == (768, 224, 'squash')
    assert rows['PE-Core-B-16::meta']['context_length'] == 32 and rows['PE-Core-B-16::meta']['family'] == 'PE-Core'
    openai = rows['ViT-B-32::openai']
    assert (openai['tokenizer'], openai['context_length'], openai['backends']) == (
        'open_clip BPE',
        77,
        'torch, onnx, openvino, tensorrt',
    )
    assert rows['ViT-H-14-worldwide::metaclip2_worldwide']['family'] == 'MetaCLIP 2'


def test_models_filters_by_family(capsys):
    cli.main(['models', '--family', 'siglip2'])
    out = capsys.readouterr().out
    rows = [line.split('  ')[0] for line in out.splitlines()[1:] if line and '::' in line.split()[0]]
    assert len(rows) >= 10 and all('SigLIP2' in row for row in rows) and 'models;' in out
