"""A bulk run killed mid-way and run again gives the same files as a run never interrupted; Ctrl-C leaves only
complete shards. Real subprocesses (`python -m clipserve embed`, decoding in worker processes), killed for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ..bulk_collection import ROOT, TINY, files_of, make_folder, run_embed

SHARDS = 21  # 41 rows, 2 per shard: many shards, so a kill lands between the first and the last
ARGS = ['--model', TINY, '--shard-size', '2', '--batch-size', '2', '--workers', '1', '--quiet']


@pytest.fixture(scope='module')
def collection(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp('bulk') / 'images')


@pytest.fixture(scope='module')
def reference(collection, tmp_path_factory):
    out = tmp_path_factory.mktemp('reference') / 'out'
    run_embed(collection, '--output', out, *ARGS)
    return files_of(out)


def _start(collection, out):
    return subprocess.Popen(
        [sys.executable, '-m', 'clipserve', 'embed', str(collection), '--output', str(out), *ARGS],
        cwd=ROOT,
        env={**os.environ, 'CLIPSERVE_CPU_BF16': '0'},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the signal reaches the decoding workers too
    )


def _complete_shards(out) -> int:
    folder = out / 'metadata'
    return len([p for p in folder.iterdir() if p.suffix == '.parquet']) if folder.is_dir() else 0


def _interrupt_mid_way(collection, out, sig) -> subprocess.Popen:
    """Start a run and send `sig` to its process group once its first shard is written, before its last."""
    process = _start(collection, out)
    deadline = time.monotonic() + 120
    while _complete_shards(out) == 0 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if process.poll() is None:
        os.killpg(process.pid, sig)
    process.wait(60)
    return process


def _run_cut_short(collection, out, sig) -> subprocess.Popen:
    for attempt in range(3):  # a run that finished before the signal landed proves nothing: again, afresh
        target = out.with_name(f'{out.name}-{attempt}')
        process = _interrupt_mid_way(collection, target, sig)
        if 0 < _complete_shards(target) < SHARDS:
            return process, target
    pytest.fail(f'three runs finished before the signal reached them ({_complete_shards(target)} shards)')


def test_a_run_killed_mid_way_then_run_again_gives_the_uninterrupted_files(collection, reference, tmp_path):
    process, out = _run_cut_short(collection, tmp_path / 'killed', signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL
    done = _complete_shards(out)
    result = run_embed(collection, '--output', out, *ARGS, '--json')
    summary = __import__('json').loads(result.stdout.strip().splitlines()[-1])
    assert summary['shards_written'] == SHARDS - done  # only what was missing was redone
    assert files_of(out) == reference  # the same bytes, every file: no row lost, none twice


def test_ctrl_c_leaves_only_complete_shards(collection, reference, tmp_path):
    process, out = _run_cut_short(collection, tmp_path / 'interrupted', signal.SIGINT)
    assert process.returncode == 130, process.stderr.read()[-3000:]
    assert 'rerun the same command to continue' in process.stderr.read()
    files = files_of(out)
    assert not [name for name in files if name.endswith('.tmp')]
    shards = {name.split('/')[1].rsplit('_', 1)[1].split('.')[0] for name in files if name.startswith('metadata/')}
    for name, data in files.items():
        if name == 'embed_job.json':
            continue
        assert name.rsplit('_', 1)[1].split('.')[0] in shards, f'{name} of a shard that is not complete'
        assert data == reference[name], f'{name} differs from the uninterrupted run'
