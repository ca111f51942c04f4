"""`python -m clipserve index` and `embed --index`: embed's output (clip-retrieval's layout) into a search index,
resumably, then served by flows/search.yml. Real subprocesses, the tiny model, generated images with captions
(tests/bulk_collection.py: image 39 is image 7 with a little noise, so its nearest neighbour is known)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import requests
import yaml

from ..bulk_collection import ROOT, TINY, caption, make_folder, read_output, run_embed
from .conftest import FlowProcess, free_port

ARGS = ['--model', TINY, '--shard-size', '10', '--workers', '0', '--quiet']


def run_index(*args, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'index', *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    if check and result.returncode != 0:
        raise AssertionError(f'index exited {result.returncode}:\n{result.stderr[-4000:]}')
    return result


def test_embeds_output_loads_into_an_index_resumably_and_flows_search_yml_serves_it(tmp_path):
    images = make_folder(tmp_path / 'images')
    out = tmp_path / 'out'
    run_embed(images, '--output', out, *ARGS)
    first = run_index(out, '--into', tmp_path / 'index', '--quiet')
    assert '40 rows from 5 shards (0 loaded before)' in first.stderr and ': 40 documents' in first.stderr
    again = run_index(out, '--into', tmp_path / 'index', '--quiet')  # nothing left to do
    assert '0 rows from 0 shards (5 loaded before)' in again.stderr and ': 40 documents' in again.stderr

    vectors = read_output(out)['img']
    config = yaml.safe_load((ROOT / 'flows' / 'search.yml').read_text())
    config['gateway']['port'] = ports = [free_port() for _ in range(3)]
    env = {'CLIPSERVE_MODEL': TINY, 'CLIPSERVE_INDEX_PATH': str(tmp_path / 'index')}
    with FlowProcess(config, tmp_path / 'flow', env):
        query = {'vector': vectors[7].astype(float).tolist(), 'top_k': 2}
        found = requests.post(f'http://127.0.0.1:{ports[1]}/v1/search', json=query, timeout=60).json()['results']
        assert [r['text'] for r in found] == [caption(7), caption(39)]  # itself, then its near duplicate
        assert found[0]['uri'].endswith('img_007.jpg') and found[0]['tags']['width'] == 96


def test_embed_with_index_does_both_in_one_run(tmp_path):
    images = make_folder(tmp_path / 'images', n=12, corrupt=False)
    result = run_embed(images, '--output', tmp_path / 'out', *ARGS, '--index', tmp_path / 'index')
    assert '12 documents in the index' in result.stderr
    from clipserve.index.edge import EdgeStore

    store = EdgeStore(tmp_path / 'index')
    try:
        assert store.count() == 12 and store.settings.dim == 64
        hit = store.search([np.asarray(read_output(tmp_path / 'out')['img'][3], np.float32)], 1)[0][0]
        assert hit.payload['text'] == caption(3)
    finally:
        store.close()


def test_fixable_mistakes_are_one_line_and_status_2(tmp_path):
    not_embed = tmp_path / 'plain'
    not_embed.mkdir()
    result = run_index(not_embed, '--into', tmp_path / 'index', check=False)
    assert result.returncode == 2 and 'is not the output of `python -m clipserve embed`' in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_index(not_embed, check=False)
    assert result.returncode == 2 and 'name exactly one index' in result.stderr
    env_run = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'index', str(not_embed), '--into', '/dev/null/index'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ,
    )
    assert env_run.returncode == 2
