"""The command line (clipserve/cli): one parser with a subcommand per job and `--help` at every level; the
shipped Flows found from a checkout and from a wheel; `models` from the catalogue's snapshot (which must equal
what the installed open_clip says); `serve`'s Flow built from flags; and every fixable mistake refused in one
line with status 2 before a model loads or a file is written."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from clipserve.cli import COMMANDS, main
from clipserve.cli import serve as serve_cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / 'flows').glob('*.yml'))
TINY = 'clipserve-tiny::random'


def run_cli(*argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    return exited.value.code or 0, out, err


# ---- the shipped Flows -------------------------------------------------------------------------------


def test_a_bare_name_finds_the_shipped_flow_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert serve_cli.find_flow('onnx.yml').resolve() == (ROOT / 'flows' / 'onnx.yml').resolve()
    with pytest.raises(serve_cli.UsageError, match='no Flow file'):
        serve_cli.find_flow('nonexistent.yml')


def test_a_wheel_install_finds_them_under_its_prefix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(serve_cli, 'SOURCE_FLOWS', tmp_path / 'no-checkout')
    monkeypatch.setattr(sys, 'prefix', str(tmp_path / 'venv'))
    installed = tmp_path / 'venv' / serve_cli.INSTALLED_FLOWS
    installed.mkdir(parents=True)
    (installed / 'torch.yml').write_text('jtype: Flow\n')
    assert serve_cli.find_flow('torch.yml') == installed / 'torch.yml'


def test_the_wheel_carries_the_flows_the_catalogue_and_the_command(tmp_path):
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
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    data = sorted(Path(n).name for n in names if f'.data/data/{serve_cli.INSTALLED_FLOWS.as_posix()}/' in n)
    assert data == SHIPPED
    assert 'clipserve/static/playground.html' in names  # the gateway's /playground page
    assert 'clipserve/models/catalogue.json' in names  # `clipserve models` and the name check read it
    [entry_points] = [n for n in names if n.endswith('entry_points.txt')]
    assert 'clipserve = clipserve.cli:main' in archive.read(entry_points).decode()


def test_no_shipped_flow_names_a_py_module_the_command_would_shadow(tmp_path):
    """`py_modules: [clipserve]` would make Jina import the `clipserve` command (a file on PATH) instead."""
    from clipserve.serving.jina.compat import shadowed_py_modules

    (tmp_path / 'clipserve').write_text('#!/bin/sh\n')  # the command, in a folder on PATH
    search = [str(tmp_path / 'elsewhere'), str(tmp_path)]
    for name in SHIPPED:
        text = (ROOT / 'flows' / name).read_text()
        assert 'clipserve.serving' in text and shadowed_py_modules(text, search) == [], name
    found = [('clipserve', str(tmp_path / 'clipserve'))]
    listed = 'executors:\n  - uses:\n      py_modules:\n        - clipserve   # the package\n        - other\n'
    assert shadowed_py_modules(listed, search) == found
    assert shadowed_py_modules('gateway:\n  py_modules: [clipserve, x.y]\n', search) == found
    assert shadowed_py_modules("  py_modules: ['clipserve.serving']\nprotocol:\n  - clipserve\n", search) == []


def test_serve_refuses_a_yaml_whose_py_module_the_command_shadows(tmp_path, monkeypatch, capsys):
    (tmp_path / 'bin').mkdir()
    (tmp_path / 'bin' / 'clipserve').write_text('#!/bin/sh\n')
    monkeypatch.setenv('PATH', f'{tmp_path / "bin"}:/usr/bin:/bin')
    flow = tmp_path / 'old.yml'
    flow.write_text(
        'jtype: Flow\nexecutors:\n  - uses:\n      jtype: CLIPEncoder\n      py_modules:\n        - clipserve\n'
    )
    status, _, err = run_cli('serve', str(flow), capsys=capsys)
    assert status == 2 and err.count('\n') == 1
    assert f'would import {tmp_path / "bin" / "clipserve"}' in err and 'write `clipserve.serving`' in err


# ---- help and dispatch --------------------------------------------------------------------------------


def test_help_lists_every_command_and_each_has_its_own(capsys):
    status, out, _ = run_cli('--help', capsys=capsys)
    assert status == 0 and all(f'    {command}' in out for command in COMMANDS) and 'exit status' in out
    for argv in [[c, '--help'] for c in COMMANDS] + [['export', 'onnx', '--help'], ['export', 'reranker', '--help']]:
        status, out, _ = run_cli(*argv, capsys=capsys)
        assert status == 0 and out.startswith(f'usage: clipserve {" ".join(argv[:-1])}'), argv
    assert '--model' in run_cli('serve', '--help', capsys=capsys)[1]
    assert '--output' in run_cli('embed', '--help', capsys=capsys)[1]  # the job's own options
    assert '--into' in run_cli('index', '--help', capsys=capsys)[1]


def test_the_console_script_and_python_m_are_the_same_command():
    script = Path(sys.executable).parent / 'clipserve'
    assert script.is_file(), 'pip install -e . installs the `clipserve` command'
    for command in ([str(script)], [sys.executable, '-m', 'clipserve']):
        done = subprocess.run([*command, '--version'], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith('clipserve '), done.stderr


def table_names(out: str) -> list[str]:
    """The names in `models`' table: its rows up to the first empty line, the header left out."""
    return [line[2:].split()[0] for line in out.split('\n\n')[0].splitlines()[1:]]


# ---- models --------------------------------------------------------------------------------------------


def test_the_snapshot_is_what_the_installed_open_clip_says():
    """catalogue.json is generated (`python -m clipserve.models.catalogue`); an open_clip upgrade must regenerate it."""
    from clipserve.models.catalogue import SNAPSHOT

    # in a fresh interpreter: other tests register architectures of their own in this one's open_clip
    code = 'import json; from clipserve.models.catalogue import snapshot; print(json.dumps(snapshot()))'
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(SNAPSHOT.read_text()) == json.loads(done.stdout), 'run python -m clipserve.models.catalogue'


def test_models_lists_every_pretrained_pair_with_its_facts(capsys):
    import open_clip

    rows = {row['name']: row for row in json.loads(run_cli('models', '--json', '--all', capsys=capsys)[1])}
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


def test_the_table_fits_100_columns_marks_the_default_and_filters(capsys):
    status, out, _ = run_cli('models', capsys=capsys)
    assert status == 0 and max(len(line) for line in out.splitlines()) <= 100
    [default] = [line for line in out.splitlines() if line.startswith('*')]
    assert default.split()[1] == 'ViT-B-32::openai'
    for argv in (['--family', 'siglip2'], ['vit-b-32::']):
        shown = table_names(run_cli('models', *argv, capsys=capsys)[1])
        listed = json.loads(run_cli('models', *argv, '--json', capsys=capsys)[1])
        assert shown == [row['name'] for row in listed] and len(shown) >= 10
    assert {
        row['family'] for row in json.loads(run_cli('models', '--family', 'SIGLIP2', '--json', capsys=capsys)[1])
    } == {'SigLIP2'}
    assert all('vit-b-32::' in name.lower() for name in table_names(run_cli('models', 'vit-b-32::', capsys=capsys)[1]))
    status, out, _ = run_cli('models', 'no-such-thing', capsys=capsys)
    assert status == 1 and 'no model matches' in out


# ---- serve: the Flow the flags build -------------------------------------------------------------------


def printed_flow(*argv, capsys) -> dict:
    status, out, err = run_cli('serve', *argv, '--print-flow', capsys=capsys)
    assert status == 0, err
    return yaml.safe_load(out)


def test_flags_build_an_encoder_behind_grpc_and_http(capsys, monkeypatch):
    monkeypatch.delenv('CLIPSERVE_AUTH_TOKEN', raising=False)
    flow = printed_flow('--model', TINY, '--port', '8080', '--backend', 'onnx', '--dtype', 'fp32', capsys=capsys)
    gateway, [encoder] = flow['gateway'], flow['executors']
    assert (gateway['uses'], gateway['protocol'], gateway['port'], gateway['host']) == (
        'ReadyGateway',
        ['grpc', 'http'],
        [51000, 8080],
        '0.0.0.0',
    )
    assert encoder['host'] == '127.0.0.1' and encoder['uses']['py_modules'] == ['clipserve.serving']
    assert encoder['uses']['with'] == {'name': TINY, 'backend': 'onnx', 'dtype': 'fp32'}
    assert encoder['allow_concurrent'] is True and encoder['replicas'] == 1


def test_a_token_an_index_a_reranker_and_replicas(capsys, tmp_path):
    reranker = tmp_path / 'reranker'
    reranker.mkdir()
    argv = ['--model', TINY, '--token', 's3cret', '--index', str(tmp_path / 'ix'), '--reranker', str(reranker)]
    flow = printed_flow(*argv, '--replicas', '2', '--protocols', 'http', '--host', '127.0.0.1', capsys=capsys)
    assert flow['gateway']['uses'] == 'ClipServeGateway' and flow['gateway']['uses_with'] == {'auth': 'required'}
    assert 's3cret' not in json.dumps(flow)  # the token travels in the environment, never in the YAML
    assert (flow['gateway']['protocol'], flow['gateway']['port']) == (['http'], [51001])
    encoder, indexer, ranker = flow['executors']
    assert encoder['replicas'] == 2
    assert (indexer['uses']['jtype'], indexer['uses']['with']) == ('CLIPIndexer', {'index_path': str(tmp_path / 'ix')})
    assert (ranker['uses']['jtype'], ranker['uses']['with']) == ('CrossEncoderRanker', {'name': str(reranker)})


@pytest.mark.parametrize(
    'argv, says',
    [
        (['--model', 'ViT-B-23::openai'], "unknown model architecture 'ViT-B-23'"),
        (['--model', 'ViT-B-32::opnai'], 'Did you mean: openai?'),
        (['--model', 'M-CLIP/nope'], 'unknown M-CLIP model'),
        (['--model', 'ViT-B-32::/no/such/weights.pt'], 'do not exist'),
        (['--port', '70000'], 'each from 1 to 65535'),
        (['--port', '51000'], 'and different'),
        (['--protocols', 'grpc,smtp'], '--protocols'),
        (['--replicas', '0'], 'at least 1'),
        (['--model-path', '/no/such/export'], "--model-path '/no/such/export': no such folder"),
        (['--reranker', './no-such-reranker'], 'no such folder'),
        (['torch.yml', '--model', TINY], '--model: these flags build a Flow'),
        (['torch.yml', '--port', '8080', '--host', '127.0.0.1'], '--port, --host: these flags build a Flow'),
        (['no-such-flow.yml'], 'no Flow file'),
    ],
)
def test_serve_refuses_what_can_be_fixed_in_one_line(argv, says, capsys):
    status, _, err = run_cli('serve', *argv, capsys=capsys)
    assert status == 2 and err.startswith('clipserve serve: ') and err.count('\n') == 1 and says in err


def test_a_mistyped_model_is_refused_without_loading_anything(tmp_path):
    """serve and embed: exit 2 with one line, no torch or Jina imported, nothing written."""
    out = tmp_path / 'embeddings'
    (tmp_path / 'images').mkdir()
    check = (
        'import sys, atexit\n'
        'atexit.register(lambda: print("loaded:", sorted({"torch", "jina", "open_clip"} & set(sys.modules))))\n'
        'from clipserve.cli import main\n'
        'main(sys.argv[1:])\n'
    )
    for argv in (
        ['serve', '--model', 'ViT-B-23::openai'],
        ['embed', str(tmp_path / 'images'), '--output', str(out), '--model', 'ViT-B-32::opnai'],
    ):
        done = subprocess.run([sys.executable, '-c', check, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count('\n') == 1 and 'Did you mean' in done.stderr
        assert 'loaded: []' in done.stdout
    assert not out.exists()


def test_clip_as_service_forms_still_serve_a_yaml(capsys):
    """`python -m clipserve torch.yml` (no command) is `serve torch.yml`; shown with --print-flow."""
    status, out, _ = run_cli('torch.yml', '--print-flow', capsys=capsys)
    assert status == 0 and out == (ROOT / 'flows' / 'torch.yml').read_text()


def test_a_port_in_use_is_said_before_anything_starts(capsys):
    import socket

    with socket.socket() as held:
        held.bind(('127.0.0.1', 0))
        held.listen()
        port = held.getsockname()[1]
        status, _, err = run_cli('serve', '--model', TINY, '--host', '127.0.0.1', '--port', str(port), capsys=capsys)
    assert status == 2 and err.count('\n') == 1 and f'port {port} on 127.0.0.1 is not free' in err
