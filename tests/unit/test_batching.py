"""The model thread: one thread for every forward pass; merged forward passes across requests, each caller
gets exactly its own rows."""

import threading

import numpy as np
import pytest

from clipserve.batching import ModelThread, Task, pad_to


def test_concurrent_callers_share_forward_passes_and_get_their_own_rows():
    calls = []

    def model(x):
        calls.append(len(x))
        return x * 10

    coalescer = ModelThread({'x': Task(model)}, max_batch=64, max_wait=0.2, others_in_flight=lambda: True)
    results, barrier = {}, threading.Barrier(8)

    def client(i):
        barrier.wait()
        rows = np.full((i + 1, 3), float(i))
        results[i] = coalescer('x', rows)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    coalescer.close()
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full((i + 1, 3), 10.0 * i))
    assert sum(calls) == sum(range(1, 9)) and len(calls) < 8


def test_max_batch_is_respected():
    calls = []
    coalescer = ModelThread(
        {'x': Task(lambda x: calls.append(len(x)) or x)}, max_batch=4, max_wait=0.2, others_in_flight=lambda: True
    )
    threads = [threading.Thread(target=coalescer, args=('x', np.zeros((3, 1)))) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    coalescer.close()
    assert max(calls) <= 4 and sum(calls) == 12


def test_model_errors_reach_the_callers_of_that_batch_only():
    def model(x):
        if np.any(x < 0):
            raise RuntimeError('boom')
        return x

    coalescer = ModelThread({'x': Task(model)}, max_batch=8, max_wait=0.0, others_in_flight=lambda: False)
    with pytest.raises(RuntimeError, match='boom'):
        coalescer('x', np.array([[-1.0]]))
    np.testing.assert_array_equal(coalescer('x', np.array([[2.0]])), [[2.0]])  # the batcher keeps running
    coalescer.close()


def test_text_batches_of_different_lengths_are_padded():
    widths = []

    def model(ids, mask):
        widths.append(ids.shape[1])
        return ids.sum(axis=1, keepdims=True)

    coalescer = ModelThread(
        {'texts': Task(model, pad_columns=True)}, max_batch=8, max_wait=0.2, others_in_flight=lambda: True
    )
    out = {}
    barrier = threading.Barrier(2)

    def call(key, ids):
        barrier.wait()
        out[key] = coalescer('texts', ids, np.ones_like(ids))

    a, b = np.array([[1, 2]]), np.array([[1, 2, 3, 4]])
    threads = [threading.Thread(target=call, args=('a', a)), threading.Thread(target=call, args=('b', b))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    coalescer.close()
    assert out['a'].tolist() == [[3]] and out['b'].tolist() == [[10]]
    assert pad_to([a], 4)[0].tolist() == [[1, 2, 0, 0]]


def test_a_backlog_is_split_so_the_next_batch_is_ready():
    """Double buffering: with a full batch of rows waiting, a batch takes half and leaves half for
    the next forward pass, which can start the moment this one ends."""
    gate, calls = threading.Event(), []

    def model(x):
        calls.append(len(x))
        gate.wait(5)
        return x

    coalescer = ModelThread({'x': Task(model)}, max_batch=8, max_wait=0.0, others_in_flight=lambda: True)
    first = threading.Thread(target=coalescer, args=('x', np.zeros((1, 1))))
    first.start()
    while not calls:  # the first forward pass is running (and blocked)
        threading.Event().wait(0.005)
    backlog = [threading.Thread(target=coalescer, args=('x', np.zeros((2, 1)))) for _ in range(4)]
    [t.start() for t in backlog]
    while coalescer._queue.qsize() < 4:
        threading.Event().wait(0.005)
    gate.set()
    [t.join() for t in [first, *backlog]]
    coalescer.close()
    assert calls == [1, 4, 4]


def test_kinds_are_never_merged_and_both_run_on_the_one_thread():
    """Images and texts waiting together each get their own forward pass, on the same thread, in order."""
    gate, passes = threading.Event(), []

    def task(kind):
        def run(x):
            passes.append((kind, len(x), threading.get_ident()))
            gate.wait(5)
            return x + (1 if kind == 'images' else 2)

        return run

    thread = ModelThread(
        {'images': Task(task('images')), 'texts': Task(task('texts'))},
        max_batch=8,
        max_wait=0.0,
        others_in_flight=lambda: True,
    )
    out = {}

    def call(key, kind, rows):
        out[key] = thread(kind, np.zeros((rows, 1)))

    first = threading.Thread(target=call, args=('first', 'images', 1))
    first.start()
    while not passes:
        threading.Event().wait(0.005)
    waiting = [('t1', 'texts', 2), ('i1', 'images', 3), ('t2', 'texts', 1), ('i2', 'images', 1)]
    threads = []
    for args in waiting:  # queued in this order while the first pass runs
        threads.append(threading.Thread(target=call, args=args))
        threads[-1].start()
        while thread._queue.qsize() < len(threads):
            threading.Event().wait(0.005)
    gate.set()
    [t.join() for t in [first, *threads]]
    thread.close()
    assert [(kind, rows) for kind, rows, _ in passes] == [('images', 1), ('texts', 3), ('images', 4)]
    assert len({ident for _, _, ident in passes}) == 1
    assert out['t1'].tolist() == [[2.0]] * 2 and out['i1'].tolist() == [[1.0]] * 3 and out['t2'].tolist() == [[2.0]]


def test_without_max_wait_every_call_runs_alone_in_arrival_order():
    calls = []
    thread = ModelThread({'x': Task(lambda x: calls.append(x[0, 0]) or x)}, max_batch=8)
    for i in range(5):
        thread('x', np.full((2, 1), float(i)))
    thread.close()
    assert calls == [0.0, 1.0, 2.0, 3.0, 4.0] and not thread.batching


def test_close_cancels_queued_calls_and_refuses_new_ones():
    from concurrent.futures import CancelledError

    gate, started = threading.Event(), threading.Event()

    def model(x):
        started.set()
        gate.wait(5)
        return x

    thread = ModelThread({'x': Task(model)}, max_batch=8)
    errors = []

    def call():
        try:
            thread('x', np.zeros((1, 1)))
        except CancelledError as error:
            errors.append(error)

    running = threading.Thread(target=call)
    running.start()
    started.wait(5)
    queued = threading.Thread(target=call)
    queued.start()
    while thread._queue.qsize() < 1:
        threading.Event().wait(0.005)
    closer = threading.Thread(target=thread.close)
    closer.start()
    while not thread._closed:
        threading.Event().wait(0.005)
    gate.set()  # the running pass finishes; the queued call is cancelled
    [t.join(5) for t in (running, queued, closer)]
    assert len(errors) == 1
    with pytest.raises(CancelledError):
        thread('x', np.zeros((1, 1)))
