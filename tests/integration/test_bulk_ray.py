"""`embed --engine ray` on a real two-node Ray cluster gives the local engine's rows and vectors.

The cluster runs inside a network namespace and a PID namespace the test makes (`unshare -n -p -f`), with
only loopback up: Ray started plainly advertises the machine's own interface address even when told
127.0.0.1, and every connection of a test must stay on loopback. Each node has 3 logical CPUs and each
model actor asks for 2, so the two actors land on different nodes and a CPU stays free on each for the
read and decode tasks (with all CPUs taken by actors, those would wait forever). The cluster's own
processes run from a venv with Ray alone (`.venv-ray`, made here once): Ray 2.60's dashboard refuses the
pydantic 1 that clipserve's Jina gateway needs, while the job's workers run this venv's Python (the
driver names it as the job's py_executable). The cluster is stopped by the processes' ids, and the PID
namespace ends with the script whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

from clipserve.jobs.cli import main as embed

from ..bulk_collection import ROOT, TINY, cosines, make_folder, read_output

RAY_VENV = ROOT / '.venv-ray'
CI = os.environ.get('CI', '').lower() == 'true'


def _unavailable(reason: str):
    if CI:
        pytest.fail(reason)
    pytest.skip(reason)


def ray_venv() -> Path:
    """A venv with the same Ray as this one and nothing else, for `ray start` (made once, reused)."""
    import ray

    python = RAY_VENV / 'bin' / 'python'
    marker = RAY_VENV / f'.ray-{ray.__version__}'
    with FileLock(ROOT / '.venv-ray.lock'):  # one test process makes it; the others wait
        if not marker.is_file():
            shutil.rmtree(RAY_VENV, ignore_errors=True)
            made = subprocess.run([sys.executable, '-m', 'venv', str(RAY_VENV)], capture_output=True, text=True)
            pip = [
                str(python),
                '-m',
                'pip',
                'install',
                '-q',
                '-c',
                str(ROOT / 'constraints.txt'),
                f'ray=={ray.__version__}',
            ]
            installed = made.returncode == 0 and subprocess.run(pip, capture_output=True, text=True, timeout=900)
            if not installed or installed.returncode != 0:
                _unavailable(f'cannot make {RAY_VENV}: {(installed and installed.stderr or made.stderr)[-1500:]}')
            marker.write_text('complete\n')
    return python


SCRIPT = r"""
set -u
ip link set lo up
export RAY_USAGE_STATS_ENABLED=0
RAY="{ray_python} -m ray.scripts.scripts"
$RAY start --head --node-ip-address 127.0.0.1 --port {port} --num-cpus 3 --include-dashboard false \
    --temp-dir {temp} --object-store-memory 200000000 --disable-usage-stats >{temp}/head.log 2>&1 \
  && $RAY start --address 127.0.0.1:{port} --node-ip-address 127.0.0.1 --num-cpus 3 \
    --object-store-memory 200000000 >{temp}/node.log 2>&1
started=$?
if [ $started -eq 0 ]; then
  {python} -m clipserve embed {input} --output {output} --model {model} --engine ray --address 127.0.0.1:{port} \
      --actors 2 --actor-cpus 2 --shard-size 16 --batch-size 2 --quiet --json >{temp}/summary.json 2>{temp}/embed.log
  status=$?
else
  cat {temp}/head.log {temp}/node.log >&2
  status=100
fi
# stop the cluster by its processes' ids: every process of this PID namespace but this shell
for pid in $(ps -eo pid= | tr -d ' '); do
  [ "$pid" != "$$" ] && [ "$pid" != 1 ] && kill -TERM "$pid" 2>/dev/null
done
sleep 1
for pid in $(ps -eo pid= | tr -d ' '); do
  [ "$pid" != "$$" ] && [ "$pid" != 1 ] && kill -KILL "$pid" 2>/dev/null
done
exit $status
"""


def test_the_ray_engine_on_two_nodes_gives_the_local_engines_output(tmp_path):
    pytest.importorskip('ray.data')
    probe = subprocess.run(['unshare', '-n', '-p', '-f', '--mount-proc', 'true'], capture_output=True, text=True)
    if probe.returncode != 0:
        _unavailable(f'cannot make network and PID namespaces (unshare, as root): {probe.stderr.strip()}')
    ray_python = ray_venv()
    collection = make_folder(tmp_path / 'images')
    local = tmp_path / 'local'
    embed(
        [
            str(collection),
            '--output',
            str(local),
            '--model',
            TINY,
            '--shard-size',
            '16',
            '--batch-size',
            '8',
            '--workers',
            '0',
            '--quiet',
        ]
    )
    temp = Path(tempfile.mkdtemp(prefix='ray', dir='/tmp'))  # short: Ray's socket paths live under it
    try:
        script = temp / 'cluster.sh'
        script.write_text(
            SCRIPT.format(
                ray_python=ray_python,
                python=sys.executable,
                port=6379,
                temp=temp,
                input=collection,
                output=tmp_path / 'ray',
                model=TINY,
            )
        )
        env = {**os.environ, 'CLIPSERVE_CPU_BF16': '0'}
        done = subprocess.run(
            ['unshare', '-n', '-p', '-f', '--mount-proc', 'bash', str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
            cwd=ROOT,
        )
        log = (temp / 'embed.log').read_text()[-4000:] if (temp / 'embed.log').exists() else ''
        assert done.returncode == 0, f'exit {done.returncode}\n{done.stderr[-3000:]}\n{log}'
        summary = json.loads((temp / 'summary.json').read_text().strip().splitlines()[-1])
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    # batches of 2 (the local run's are 8; embeddings do not depend on their batch mates): 20+ batches, so the
    # actor that loads its model last still gets some (with 5, the first one ready took them all on a busy CI)
    assert (summary['engine'], summary['actors'], summary['nodes_used']) == ('ray', 2, 2)
    assert (summary['embedded'], summary['errors'], summary['shards_written']) == (40, 1, 3)
    expected, got = read_output(local), read_output(tmp_path / 'ray')
    assert got['metadata'].equals(expected['metadata'])
    assert got['errors'].equals(expected['errors'])
    assert cosines(got['img'], expected['img']).min() >= 0.99999
    assert cosines(got['text'], expected['text']).min() >= 0.99999
    assert sorted(p.name for p in (tmp_path / 'ray' / 'img_emb').iterdir()) == sorted(
        p.name for p in (local / 'img_emb').iterdir()
    )
