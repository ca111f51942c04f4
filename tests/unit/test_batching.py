"""The cross-request batcher: merged forward passes, each caller gets exactly its own rows."""

import threading

import numpy as np
import pytest

from clipserve.batching import Coalescer, pad_to


def test_concurrent_callers_share_forward_passes_and_get_their_own_rows():
    calls = []

    def model(x):
        calls.append(len(x))
        return x * 10

    coalescer = Coalescer(model, max_batch=64, max_wait=0.2, others_in_flight=lambda: True)
    results, barrier = {}, threading.Barrier(8)

    def client(i):
        barrier.wait()
        rows = np.full((i + 1, 3), float(i))
        results[i] = coalescer(rows)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    coalescer.close()
    for i in range(8):
        np.testing.assert_array_equal(results[i], np.full((i + 1, 3), 10.0 * i))
    assert sum(calls) == sum(range(1, 9)) and len(calls) < 8


def test_max_batch_is_respected():
    calls = []
    coalescer = Coalescer(lambda x: calls.append(len(x)) or x, max_batch=4, max_wait=0.2, others_in_flight=lambda: True)
    threads = [threading.Thread(target=coalescer, args=(np.zeros((3, 1)),)) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    coalescer.close()
    assert max(calls) <= 4 and sum(calls) == 12


def test_model_errors_reach_the_callers_of_that_batch_only():
    def model(x):
        if np.any(x < 0):
            raise RuntimeError('boom')
        return x

    coalescer = Coalescer(model, max_batch=8, max_wait=0.0, others_in_flight=lambda: False)
    with pytest.raises(RuntimeError, match='boom'):
        coalescer(np.array([[-1.0]]))
    np.testing.assert_array_equal(coalescer(np.array([[2.0]])), [[2.0]])  # the batcher keeps running
    coalescer.close()


def test_text_batches_of_different_lengths_are_padded():
    widths = []

    def model(ids, mask):
        widths.append(ids.shape[1])
        return ids.sum(axis=1, keepdims=True)

    coalescer = Coalescer(model, max_batch=8, max_wait=0.2, others_in_flight=lambda: True, pad_columns=True)
    out = {}
    barrier = threading.Barrier(2)

    def call(key, ids):
        barrier.wait()
        out[key] = coalescer(ids, np.ones_like(ids))

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

    coalescer = Coalescer(model, max_batch=8, max_wait=0.0, others_in_flight=lambda: True)
    first = threading.Thread(target=coalescer, args=(np.zeros((1, 1)),))
    first.start()
    while not calls:  # the first forward pass is running (and blocked)
        threading.Event().wait(0.005)
    backlog = [threading.Thread(target=coalescer, args=(np.zeros((2, 1)),)) for _ in range(4)]
    [t.start() for t in backlog]
    while coalescer._queue.qsize() < 4:
        threading.Event().wait(0.005)
    gate.set()
    [t.join() for t in [first, *backlog]]
    coalescer.close()
    assert calls == [1, 4, 4]
