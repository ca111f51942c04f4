"""The store interface (index/store.py), held by each implementation: the embedded engine in this process
(edge.py), the same in a process of its own (worker.py, what the indexer runs) and qdrant-client's in-process
mode (server.py, the Qdrant-server path: no server runs here). Real engines, real files."""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from clipserve.engine.ranking import maxsim
from clipserve.errors import VectorStoreError
from clipserve.index.edge import EdgeStore
from clipserve.index.points import Point, point_id
from clipserve.index.server import ServerStore
from clipserve.index.store import CollectionSettings
from clipserve.index.worker import StoreProcess

KINDS = ['edge', 'process', 'client']


def open_store(kind, folder, settings=CollectionSettings(), name='c'):
    if kind == 'edge':
        return EdgeStore(folder, settings)
    if kind == 'process':
        return StoreProcess(folder, settings, optimize_after=1_000_000)
    return ServerStore(':memory:', name, settings)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def vectors(n, dim=16, seed=0):
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def test_write_search_update_delete_clear(kind, tmp_path):
    store = open_store(kind, tmp_path / 'index')
    try:
        x = vectors(50)
        store.upsert([Point(f'doc-{i}', x[i], {'text': f'caption {i}', 'tags': {'i': float(i)}}) for i in range(50)])
        assert store.count() == 50 and store.settings.dim == 16 and store.settings.pages is False
        hits = store.search([x[7], x[9]], 3)
        assert [h[0].document_id for h in hits] == ['doc-7', 'doc-9']
        assert hits[0][0].payload == {'text': 'caption 7', 'tags': {'i': 7.0}} and hits[0][0].score == pytest.approx(
            1, abs=1e-5
        )
        assert [len(h) for h in hits] == [3, 3] and hits[0][0].score >= hits[0][1].score >= hits[0][2].score
        # update: existing documents only; a new one is not added
        assert store.update([Point('doc-7', x[8], {'text': 'moved'}), Point('nowhere', x[8], {})]) == ['doc-7']
        assert store.count() == 50
        assert {h.document_id for h in store.search([x[8]], 2)[0]} == {'doc-7', 'doc-8'}
        store.upsert([Point('doc-7', x[7], {'text': 'back'})])  # the same id replaces
        assert store.count() == 50
        store.delete(['doc-9', 'not-there'])
        assert store.count() == 49 and 'doc-9' not in {h.document_id for h in store.search([x[9]], 5)[0]}
        store.clear()
        assert store.count() == 0 and store.search([x[0]], 3) == [[]]
        store.upsert([Point('again', x[0], {})])  # the same size as before: the collection kept its settings
        assert store.count() == 1
    finally:
        store.close()


def test_a_vector_of_another_size_is_a_clear_error_and_writes_nothing(kind, tmp_path):
    store = open_store(kind, tmp_path / 'index')
    try:
        store.upsert([Point('a', vectors(1)[0], {})])
        with pytest.raises(VectorStoreError, match='16-dimensional.*8-dimensional|8-dimensional.*16-dimensional'):
            store.upsert([Point('b', vectors(1, dim=8)[0], {})])
        with pytest.raises(VectorStoreError, match='different sizes'):
            store.upsert([Point('c', vectors(1)[0], {}), Point('d', vectors(1, dim=8)[0], {})])
        assert store.count() == 1
    finally:
        store.close()


def test_pages_of_vectors_are_searched_by_maxsim_in_the_exact_order(kind, tmp_path):
    """ColPali-style pages: the engine's multi-vector comparator gives the exact MaxSim order (the same
    dot-product MaxSim /rank computes, engine/ranking.py)."""
    rng = np.random.default_rng(3)
    pages = [rng.normal(size=(int(rng.integers(5, 30)), 32)).astype(np.float32) for _ in range(60)]
    queries = [rng.normal(size=(int(rng.integers(3, 9)), 32)).astype(np.float32) for _ in range(5)]
    store = open_store(kind, tmp_path / 'pages')
    try:
        store.upsert([Point(f'page-{i}', page, {}) for i, page in enumerate(pages)])
        assert store.settings.pages is True and store.settings.metric == 'inner_product'
        exact = maxsim(queries, pages)
        for q, hits in enumerate(store.search(queries, 10)):
            want = [f'page-{i}' for i in np.argsort(-exact[q], kind='stable')[:10]]
            assert [h.document_id for h in hits] == want
            assert [h.score for h in hits] == pytest.approx(sorted(exact[q], reverse=True)[:10], rel=1e-4)
        with pytest.raises(VectorStoreError, match='page of vectors'):
            store.upsert([Point('flat', pages[0][0], {})])
    finally:
        store.close()


def test_point_ids_are_the_same_for_a_document_everywhere():
    assert point_id('doc-1') == point_id('doc-1') != point_id('doc-2')
    assert len(point_id('a' * 32)) == 36  # a UUID, whatever the document id looks like


@pytest.mark.parametrize('kind', ['edge', 'process'])
def test_the_embedded_index_reopens_with_its_settings_and_every_point(kind, tmp_path):
    store = open_store(kind, tmp_path / 'index', CollectionSettings(metric='euclidean', columns=(('c', 'str'),)))
    store.upsert([Point(f'd{i}', v, {}) for i, v in enumerate(vectors(30))])
    store.close()
    again = open_store(kind, tmp_path / 'index', CollectionSettings(ef_search=64))  # other settings given
    try:
        assert again.count() == 30
        assert (again.settings.metric, again.settings.dim, again.settings.ef_search) == ('euclidean', 16, 64)
        assert again.settings.columns == (('c', 'str'),) and again.settings.pages is False
        saved = json.loads((tmp_path / 'index' / 'collection.json').read_text())  # last rounds' indexes read alike
        assert saved['multi_vector'] is False and 'pages' not in saved and again.status()['multi_vector'] is False
    finally:
        again.close()


def test_an_unwritable_folder_is_a_clear_error_at_start(tmp_path):
    blocker = tmp_path / 'a-file'
    blocker.write_text('not a folder')
    for make in (lambda: EdgeStore(blocker / 'index'), lambda: StoreProcess(blocker / 'index')):
        with pytest.raises(VectorStoreError, match='cannot be written.*index_path'):
            make()


def test_the_index_process_comes_back_after_it_dies_with_every_acknowledged_point(tmp_path):
    store = StoreProcess(tmp_path / 'index', optimize_after=1_000_000)
    try:
        store.upsert([Point(f'd{i}', v, {}) for i, v in enumerate(vectors(40))])
        os.kill(store._process.pid, signal.SIGKILL)
        with pytest.raises(VectorStoreError, match='was killed by SIGKILL; the next call restarts it'):
            store.count()
        assert store.count() == 40  # restarted: the shard reopened from its write-ahead log
    finally:
        store.close()


def test_a_death_between_two_calls_is_reported_by_the_next_one_not_hidden(tmp_path):
    store = StoreProcess(tmp_path / 'index', optimize_after=1_000_000)
    try:
        store.upsert([Point(f'd{i}', v, {}) for i, v in enumerate(vectors(12))])
        os.kill(store._process.pid, signal.SIGKILL)
        store._process.wait()  # dead before the next call starts (the other test's call may meet it mid-call)
        with pytest.raises(VectorStoreError, match='was killed by SIGKILL; the next call restarts it'):
            store.search(vectors(1), 3)
        assert store.count() == 12
    finally:
        store.close()


def test_a_killed_owner_takes_its_index_process_with_it_and_loses_nothing_it_acknowledged(tmp_path):
    """kill -9 of the process that owns the store (an executor): its child dies too (it must not keep the
    shard's write-ahead log locked), and a new owner finds every point whose write had returned."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import numpy as np
        from clipserve.index.points import Point
        from clipserve.index.worker import StoreProcess
        store = StoreProcess({str(tmp_path / 'index')!r}, optimize_after=1_000_000)
        vectors = np.random.default_rng(0).normal(size=(25, 16)).astype(np.float32)
        for i in range(25):
            store.upsert([Point(f'd{{i}}', vectors[i], {{}})])
        print(store._process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    owner = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=120)
    child = int(owner.stdout.split()[0])
    try:  # the child dies with its parent (PR_SET_PDEATHSIG): wait for that event, not for the clock
        exited = os.pidfd_open(child)
    except ProcessLookupError:
        exited = None  # already gone
    if exited is not None:
        assert select.select([exited], [], [], 60)[0], 'the index process outlived its owner'
        os.close(exited)
    store = StoreProcess(tmp_path / 'index')
    try:
        assert store.count() == 25
    finally:
        store.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB filesystem of its own (tmpfs; mounting needs root, as CI and these machines have)."""
    folder = tmp_path / 'small-disk'
    folder.mkdir()
    mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f'cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}')
    yield folder
    subprocess.run(['umount', '-l', str(folder)], check=False)


def test_a_full_disk_is_a_clear_error_and_nothing_acknowledged_is_lost(small_disk):
    """The engine writes through memory-mapped files: on a full disk its process dies (SIGBUS), which the
    indexer's process survives; the error names the disk, and once there is room the index reopens with every
    point that was acknowledged."""
    store = StoreProcess(small_disk / 'index', optimize_after=1_000_000)
    acknowledged = []
    try:
        with pytest.raises(VectorStoreError, match='disk is probably full'):
            for batch in range(400):
                points = [
                    Point(f'd{batch}-{j}', vectors(1, dim=128, seed=batch * 50 + j)[0], {'text': 'x' * 300})
                    for j in range(50)
                ]
                store.upsert(points)
                acknowledged += [p.document_id for p in points]
        assert acknowledged, 'the disk filled before the first write: make it larger'
        subprocess.run(['mount', '-o', 'remount,size=64m', str(small_disk)], check=True)
        assert store.count() >= len(acknowledged)  # reopened from its write-ahead log
        found = {h.document_id for h in store.search([vectors(1, dim=128, seed=0)[0]], 1)[0]}
        assert found == {'d0-0'}
    finally:
        store.close()
