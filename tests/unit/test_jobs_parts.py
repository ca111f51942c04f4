"""The pieces of bulk embedding on their own: plans, the shard writer's names and atomic writes, the --server
client's reading of the route's errors, and Ray Data next to pydantic 1 (no sockets: Ray is only imported)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from clipserve.jobs.readers import InputError, expand_braces, plan_input, read_part
from clipserve.jobs.writers import FolderLock, OutputError, ShardWriter, check_manifest, metadata_row

from ..bulk_collection import make_folder, make_tar


def test_a_folders_plan_is_stable_and_changes_with_its_rows(tmp_path):
    folder = make_folder(tmp_path / 'images', n=5)
    first, again = plan_input(str(folder), shard_size=2), plan_input(str(folder), shard_size=2)
    assert first.kind == 'files' and first.has_captions and first.rows == 6
    assert [(p.index, p.first, p.count) for p in first.parts] == [(0, 0, 2), (1, 2, 2), (2, 4, 2)]
    assert first.fingerprint() == again.fingerprint()
    assert plan_input(str(folder), shard_size=3).fingerprint() != first.fingerprint()
    (folder / 'img_100.jpg').write_bytes((folder / 'img_000.jpg').read_bytes())
    assert plan_input(str(folder), shard_size=2).fingerprint() != first.fingerprint()
    rows = [row for part in first.parts for row in read_part(first.kind, part)]
    assert [r.position for r in rows] == list(range(6))
    assert rows[1].uri == str(folder / 'img_000.jpg') and rows[1].caption.startswith('picture 0:')


def test_webdataset_names_and_braces(tmp_path):
    assert expand_braces('a-{08..11}.tar') == ['a-08.tar', 'a-09.tar', 'a-10.tar', 'a-11.tar']
    assert expand_braces('{1..2}/x{0..1}.tar') == ['1/x0.tar', '1/x1.tar', '2/x0.tar', '2/x1.tar']
    make_tar(tmp_path / 's0.tar', 0, 2)
    make_tar(tmp_path / 's1.tar', 2, 3)
    plan = plan_input(str(tmp_path))
    assert plan.kind == 'webdataset' and [(p.first, p.count) for p in plan.parts] == [(0, 2), (2, 3)]
    rows = list(read_part(plan.kind, plan.parts[1]))
    assert [r.source.rsplit('#', 1)[1] for r in rows] == ['000002', '000003', '000004']
    assert all(r.data and r.caption for r in rows)
    with pytest.raises(InputError, match='does not exist'):
        plan_input(str(tmp_path / 's-{0..2}.tar'))


def test_a_shard_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    writer = ShardWriter(tmp_path, parts=12, images=True, texts=False, output_dtype='fp32')
    writer.prepare()
    assert writer.path('img_emb', 3).name == 'img_emb_03.npy'  # zero-padded as clip-retrieval pads
    rows = [metadata_row(7, 'https://example.com/a.jpg', 'a', 4, 3)]
    import clipserve.jobs.writers as writers

    real = writers._parquet
    calls = []

    def failing(rows):
        calls.append(1)
        if len(calls) == 2:  # the metadata, written last: the disk fills up just then
            raise OSError('No space left on device')
        return real(rows)

    failed = [metadata_row(8, 'https://example.com/b.jpg', 'b', None, None, error='bad image')]
    monkeypatch.setattr(writers, '_parquet', failing)
    with pytest.raises(OSError):  # the errors file is staged, then the metadata fails
        writer.write(3, rows, failed, np.ones((1, 4), np.float32), None)
    assert not writer.done(3)
    assert [p for p in tmp_path.rglob('*') if p.is_file()] == []  # nothing half-written, no temporary left
    monkeypatch.setattr(writers, '_parquet', real)
    writer.write(3, rows, [], np.ones((1, 4), np.float32), None)
    assert writer.done(3) and np.load(writer.path('img_emb', 3)).dtype == np.float32
    with pytest.raises(AssertionError, match='metadata 1'):
        writer.write(4, rows, [], np.ones((2, 4), np.float32), None)


def test_the_output_folder_belongs_to_one_job_and_one_run(tmp_path):
    job = {'input': '/data', 'model': 'a', 'output_dtype': 'fp16'}
    check_manifest(tmp_path, job)
    check_manifest(tmp_path, dict(job))
    with pytest.raises(OutputError, match="model: 'a' then, 'b' now"):
        check_manifest(tmp_path, {**job, 'model': 'b'})
    lock = FolderLock(tmp_path)
    with pytest.raises(OutputError, match='another embed run'):
        FolderLock(tmp_path)
    lock.release()
    FolderLock(tmp_path).release()


def test_ray_data_runs_next_to_pydantic_1():
    """Ray 2.60 refuses pydantic 1 on its first DataContext; the shim lets Ray take its no-pydantic path while
    pydantic 1 stays what everyone else imports."""
    pytest.importorskip('ray')
    code = (
        'import pydantic, jina\n'
        'from clipserve.jobs.ray_compat import hide_pydantic_v1_from_ray, pydantic_major\n'
        'hide_pydantic_v1_from_ray()\n'
        'import ray.data\n'
        'ray.data.DataContext.get_current()\n'
        'import pydantic as again\n'
        'print(pydantic_major(), again.VERSION.split(".")[0], again is pydantic)\n'
    )
    env = {**os.environ, 'RAY_USAGE_STATS_ENABLED': '0'}
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    major = done.stdout.split()
    assert major[0] == major[1] and major[2] == 'True'


def test_a_parquet_part_reads_its_own_rows_across_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({'caption': [f'c{i}' for i in range(25)]}), tmp_path / 't.parquet', row_group_size=4)
    plan = plan_input(str(tmp_path / 't.parquet'), shard_size=7)
    assert [p.count for p in plan.parts] == [7, 7, 7, 4] and not plan.parts[0].spec[2]  # no image column
    rows = [row for part in plan.parts for row in read_part(plan.kind, part)]
    assert [r.caption for r in rows] == [f'c{i}' for i in range(25)]
    assert [r.position for r in rows] == list(range(25))


class _Stream:
    def __init__(self, tty):
        self.text, self._tty = '', tty

    def isatty(self):
        return self._tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_one_progress_line_for_embed_and_index_redrawn_on_a_terminal_and_plain_in_a_log():
    from clipserve.jobs.progress import Progress, ProgressLine

    log = _Stream(tty=False)
    shards = ProgressLine(3, 'shards', stream=log)
    shards.advance(1)  # a log gets a line at once, then one every 30 s, and one at the end
    shards.advance(1)
    assert log.text.startswith('[########................] 1/3 shards (33.3%)') and log.text.count('\n') == 1
    shards.advance(1)
    shards.close()
    assert log.text.splitlines()[1].startswith('[########################] 3/3 shards (100.0%)')
    assert '\r' not in log.text and log.text.count('\n') == 2

    terminal = _Stream(tty=True)
    rows = Progress(10, skipped_rows=4, shards=2, stream=terminal)
    rows.update(10, errors=1, images=10, texts=0, shards=2)
    rows.close()
    assert terminal.text.startswith('\r[') and '10/10 rows' in terminal.text and 'shards 2/2 errors 1' in terminal.text
    assert terminal.text.endswith('\n')
    summary = rows.summary()
    assert (summary['rows'], summary['embedded'], summary['errors'], summary['skipped_rows']) == (10, 9, 1, 4)

    quiet = _Stream(tty=True)
    silent = ProgressLine(1, 'shards', quiet=True, stream=quiet)
    silent.advance(1)
    silent.close()
    assert quiet.text == ''
