"""The model thread's scheduler: one thread for every forward pass; small requests merged, large ones cut into
slices interleaved round robin with everyone else's; deadlines and cancellations dropped before they run;
each caller gets exactly its own rows."""

import threading
import time

import numpy as np
import pytest

from clipserve.engine.scheduler import Scheduler, Task, pad_to
from clipserve.engine.small_requests import SmallRequests
from clipserve.errors import DeadlineExceededError


class Recorder:
    """A forward pass that records what each batch held (the first column carries a request's tag)."""

    def __init__(self, delay=0.0):
        self.batches, self.threads, self.delay = [], set(), delay
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # a batch has reached the model (and waits at the gate if it is shut)

    def __call__(self, x, *rest):
        self.entered.set()
        self.gate.wait()
        self.threads.add(threading.get_ident())
        self.batches.append([int(v) for v in x[:, 0]])
        time.sleep(self.delay)
        return x * 10


def rows(tag, n, width=1):
    return np.full((n, width), float(tag))


def test_concurrent_requests_share_forward_passes_and_get_their_own_rows():
    model = Recorder()
    scheduler = Scheduler({'x': Task(model, batch=64)}, max_wait=0.2, others_in_flight=lambda: True)
    results, barrier = {}, threading.Barrier(8)

    def client(i):
        barrier.wait()
        results[i] = scheduler('x', rows(i, i + 1, 3))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    scheduler.close()
    for i in range(8):
        np.testing.assert_array_equal(results[i], rows(10 * i, i + 1, 3))
    assert sum(len(b) for b in model.batches) == sum(range(1, 9)) and len(model.batches) < 8


def test_the_batch_size_is_respected_and_a_large_job_is_cut_into_slices():
    model = Recorder()
    scheduler = Scheduler({'x': Task(model, batch=4)})
    out = scheduler('x', np.arange(10, dtype=float)[:, None])
    scheduler.close()
    assert [len(b) for b in model.batches] == [4, 4, 2]
    np.testing.assert_array_equal(out[:, 0], np.arange(10) * 10)


def test_each_pass_is_counted_by_kind_with_its_rows_and_reported():
    reported = []
    scheduler = Scheduler(
        {'x': Task(Recorder(), batch=4), 'y': Task(Recorder(), batch=8)},
        on_pass=lambda kind, n, seconds: reported.append((kind, n, seconds)),
    )
    scheduler('x', np.arange(10, dtype=float)[:, None])
    scheduler('y', rows(1, 3))
    scheduler.close()
    assert [(kind, n) for kind, n, _ in reported] == [('x', 4), ('x', 4), ('x', 2), ('y', 3)]
    assert all(seconds >= 0 for *_, seconds in reported)
    counts = {kind: c.as_dict() for kind, c in scheduler.passes.items()}
    assert {kind: (c['passes'], c['rows']) for kind, c in counts.items()} == {'x': (3, 10), 'y': (1, 3)}
    assert counts['x']['seconds'] == pytest.approx(sum(s for kind, _, s in reported if kind == 'x'), abs=1e-5)


def test_a_small_request_behind_large_ones_runs_in_the_next_batch():
    model = Recorder(delay=0.01)
    model.gate.clear()  # hold the first batch until everything is queued
    scheduler = Scheduler({'images': Task(model, batch=8)})
    large = [scheduler.submit('images', rows(tag, 64), request=f'large-{tag}') for tag in (1, 2, 3)]
    assert model.entered.wait(30)  # the first batch (of request 1) is now running, held at the gate
    small = scheduler.submit('images', rows(9, 1), request='small')
    model.gate.set()
    small.result(5)
    [f.result(5) for f in large]
    scheduler.close()
    first_with_small = next(i for i, batch in enumerate(model.batches) if 9 in batch)
    assert first_with_small <= 2, model.batches[:4]  # not behind the 3 x 64 rows queued before it
    assert set(model.batches[1]) >= {2, 3}  # the requests waiting together share the batch, fairly


@pytest.mark.parametrize('kind', ['images', 'texts'])
def test_a_newcomer_runs_in_the_next_batch_behind_more_large_requests_than_a_batch_has_rows(kind):
    """16 requests of 8 rows wait (a replica under load): each batch of 8 takes a row from 8 of them, and a
    newcomer that queued behind them all must not wait for the round robin to come round to it."""
    images, texts = Recorder(delay=0.01), Recorder(delay=0.01)
    texts.batches = images.batches  # one record of every forward pass, in the order they ran
    images.gate.clear()
    scheduler = Scheduler({'images': Task(images, batch=8), 'texts': Task(texts, batch=32)})
    large = [scheduler.submit('images', rows(tag, 8), request=f'large-{tag}') for tag in range(1, 17)]
    assert images.entered.wait(30)  # the first batch is running, held at the gate
    small = scheduler.submit(kind, rows(99, 1), request='small')
    images.gate.set()
    small.result(5)
    [f.result(5) for f in large]
    scheduler.close()
    first_with_small = next(i for i, batch in enumerate(images.batches) if 99 in batch)
    assert first_with_small == 1, images.batches[:4]  # right after the batch that was running
    assert sorted(sum(images.batches, [])) == sorted([tag for tag in range(1, 17) for _ in range(8)] + [99])


def test_two_large_requests_interleave_round_robin():
    model = Recorder()
    model.gate.clear()
    scheduler = Scheduler({'x': Task(model, batch=4)})
    a = scheduler.submit('x', rows(1, 8), request='a')
    b = scheduler.submit('x', rows(2, 8), request='b')
    model.gate.set()
    a.result(5), b.result(5)
    scheduler.close()
    assert all(set(batch) == {1, 2} for batch in model.batches[1:]), model.batches


def test_texts_of_different_widths_are_padded_when_merged():
    seen, gate, entered = [], threading.Event(), threading.Event()

    def model(ids, mask):
        entered.set()
        gate.wait(30)
        seen.append(ids.shape)
        return ids[:, :1].astype(float)

    scheduler = Scheduler({'t': Task(model, batch=16, pad_columns=True)})
    first = scheduler.submit('t', np.ones((1, 2)), np.ones((1, 2)))  # runs alone, held at the gate
    assert entered.wait(30)
    futures = {w: scheduler.submit('t', np.full((2, w), w), np.ones((2, w))) for w in (3, 5, 7)}
    gate.set()
    first.result(5)
    out = {w: f.result(5) for w, f in futures.items()}
    scheduler.close()
    assert all(out[w][0, 0] == w and len(out[w]) == 2 for w in (3, 5, 7))
    assert seen[1] == (6, 7)  # the three merged into one pass, padded to the widest
    assert pad_to([np.ones((1, 2))], 4)[0].tolist() == [[1, 1, 0, 0]]


def test_kinds_are_never_merged_and_all_run_on_one_thread():
    images, texts = Recorder(), Recorder()
    scheduler = Scheduler({'images': Task(images, batch=8), 'texts': Task(texts, batch=8)})
    futures = [scheduler.submit(kind, rows(i, 2), request=i) for i in range(6) for kind in ('images', 'texts')]
    [f.result(5) for f in futures]
    scheduler.close()
    assert len(images.threads | texts.threads) == 1 and threading.get_ident() not in images.threads
    assert sum(map(len, images.batches)) == sum(map(len, texts.batches)) == 12


def test_a_model_error_fails_that_batch_only_and_the_thread_keeps_running():
    def model(x):
        if np.any(x < 0):
            raise RuntimeError('boom')
        return x

    scheduler = Scheduler({'x': Task(model, batch=8)})
    with pytest.raises(RuntimeError, match='boom'):
        scheduler('x', np.array([[-1.0]]))
    np.testing.assert_array_equal(scheduler('x', np.array([[2.0]])), [[2.0]])
    scheduler.close()


def test_a_job_past_its_deadline_is_dropped_not_computed():
    model = Recorder()
    model.gate.clear()
    scheduler = Scheduler({'x': Task(model, batch=4)})
    first = scheduler.submit('x', rows(1, 4))
    assert model.entered.wait(30)  # the first batch is running, held at the gate
    deadline = time.monotonic() + 0.05
    late = scheduler.submit('x', rows(2, 4), deadline=deadline)
    cancelled = scheduler.submit('x', rows(3, 4))
    cancelled.cancel()  # the caller has gone
    while time.monotonic() <= deadline:  # the late job's deadline passes while it waits
        time.sleep(0.01)
    model.gate.set()
    first.result(5)
    with pytest.raises(DeadlineExceededError, match='deadline'):
        late.result(5)
    assert scheduler('x', rows(4, 1))[0, 0] == 40
    scheduler.close()
    assert not any(tag in batch for batch in model.batches for tag in (2, 3)) and scheduler.dropped == 2, model.batches


def test_close_cancels_queued_jobs_and_refuses_new_ones():
    model = Recorder()
    model.gate.clear()
    scheduler = Scheduler({'x': Task(model, batch=1)})
    running = scheduler.submit('x', rows(1, 1))
    assert model.entered.wait(30)
    queued = scheduler.submit('x', rows(2, 1))
    threading.Timer(0.1, model.gate.set).start()
    scheduler.close()
    assert running.result(5)[0, 0] == 10 and queued.cancelled()
    with pytest.raises(Exception, match='closed'):
        scheduler.submit('x', rows(3, 1))


def test_with_short_for_a_pass_led_by_small_newcomers_is_short_and_theirs_first():
    """Images on a CPU: a query image's pass takes 4 rows, not 8 (a full pass of 8 is what it would otherwise
    wait for): the small newcomers waiting together first, then others' rows."""
    model = Recorder(delay=0.01)
    model.gate.clear()
    scheduler = Scheduler({'images': Task(model, batch=8, short_for=SmallRequests(documents=4))})
    large = [scheduler.submit('images', rows(tag, 8), request=f'large-{tag}') for tag in range(1, 5)]
    assert model.entered.wait(30)  # the first batch is running, held at the gate
    small = [scheduler.submit('images', rows(tag, n), request=f'small-{tag}') for tag, n in [(98, 1), (99, 2)]]
    model.gate.set()
    [f.result(5) for f in small + large]
    scheduler.close()
    assert len(model.batches[1]) == 4 and sorted(model.batches[1])[1:] == [98, 99, 99]
    assert [len(batch) for batch in model.batches[2:]] == [8, 8, 7]  # full passes again
    assert sorted(sum(model.batches, [])) == sorted([t for t in range(1, 5) for _ in range(8)] + [98, 99, 99])
