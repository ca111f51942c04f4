"""The preprocessing pool (engine/priority_pool.py): while its threads are busy, the task of lowest priority
runs next (a newcomer's image before the images large requests queued earlier), ties in arrival order."""

import threading

import pytest

from clipserve.engine.priority_pool import PriorityPool


def test_lowest_priority_first_then_first_come():
    pool = PriorityPool(1)
    gate, ran = threading.Event(), []
    busy = pool.submit((0, 0), gate.wait, 5)
    tasks = [
        pool.submit(priority, ran.append, name)
        for priority, name in [((8, 8), 'large-2nd-a'), ((0, 8), 'large-a'), ((0, 8), 'large-b'), ((0, 1), 'small')]
    ]
    tasks.append(pool.submit((8, 8), ran.append, 'large-2nd-b'))
    gate.set()
    for task in [busy, *tasks]:
        task.result(5)
    pool.shutdown()
    assert ran == ['small', 'large-a', 'large-b', 'large-2nd-a', 'large-2nd-b']


def test_results_and_errors_reach_the_caller_and_shutdown_cancels_what_waits():
    pool = PriorityPool(2)
    assert pool.submit(0, pow, 2, 10).result(5) == 1024
    with pytest.raises(ZeroDivisionError):
        pool.submit(0, lambda: 1 / 0).result(5)
    gates, started = [threading.Event() for _ in range(2)], threading.Semaphore(0)

    def hold(gate):
        started.release()
        return gate.wait(5)

    running = [pool.submit(0, hold, gate) for gate in gates]
    assert started.acquire(timeout=5) and started.acquire(timeout=5)  # both workers are busy
    waiting = pool.submit(0, pow, 3, 3)
    pool.shutdown()
    assert waiting.cancelled()
    for gate in gates:
        gate.set()
    assert all(future.result(5) for future in running)
    with pytest.raises(RuntimeError, match='shutdown'):
        pool.submit(0, pow, 2, 2)
