"""EncodePipeline: forward passes stay on one thread whichever request thread asks for them; URI fetches run in
their own pool within each request's budget, so a slow host holds up only the request that named it."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from clipserve.engine.fetch import FetchBudget
from clipserve.engine.pipeline import EncodePipeline, ImageSource
from clipserve.engine.room import Room
from clipserve.engine.small_requests import SmallRequests
from clipserve.errors import DeadlineExceededError

from ..compare import assert_close
from ..waiting import wait_until


class RecordingBackend:
    """The real tiny backend, noting which thread ran each forward pass."""

    def __init__(self, backend):
        self._backend = backend
        self.threads = set()

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def encode_texts(self, *arrays):
        self.threads.add(threading.get_ident())
        return self._backend.encode_texts(*arrays)

    def encode_images(self, pixels):
        self.threads.add(threading.get_ident())
        return self._backend.encode_images(pixels)


@pytest.mark.parametrize('batch_wait', [None, 0.002])
def test_forward_passes_from_many_request_threads_run_on_one_model_thread(tiny_backend, batch_wait):
    backend = RecordingBackend(tiny_backend)
    pipeline = EncodePipeline(backend, minibatch_size=4, batch_wait=batch_wait)
    size = tiny_backend.preprocess.image_size
    pixels = np.random.default_rng(0).random((3, size, size), dtype=np.float32)
    try:

        def request(i):
            texts = pipeline.encode_texts([f'request {i} text {j}' for j in range(6)])
            images = pipeline.encode_images([lambda: pixels] * 3)
            return texts, images

        with ThreadPoolExecutor(6) as requests:
            results = list(requests.map(request, range(12)))
    finally:
        pipeline.close()
    assert len(backend.threads) == 1
    assert not backend.threads & {threading.get_ident()}
    expected = tiny_backend.encode_texts(pipeline.tokenizer(['request 5 text 2']).input_ids)
    assert_close(results[5][0][2], expected[0], rel=1e-5)
    assert results[7][1].indices == [0, 1, 2] and not results[7][1].failures


def test_a_model_error_reaches_the_caller_and_the_pipeline_keeps_working(tiny_backend):
    pipeline = EncodePipeline(tiny_backend, minibatch_size=4)
    try:
        with pytest.raises(IndexError):  # token ids far outside the vocabulary
            ids = np.full((2, 3), 10**7, dtype=np.int64)
            pipeline.scheduler('texts', ids, np.ones((2, 3), dtype=np.int64))
        assert pipeline.encode_texts(['still serving']).shape == (1, tiny_backend.embed_dim)
    finally:
        pipeline.close()


def _pixels(backend, value=0.5):
    size = backend.preprocess.image_size
    return np.full((3, size, size), value, dtype=np.float32)


def test_a_slow_fetch_holds_up_only_its_own_request(tiny_backend):
    """12 images from a slow host (4 fetching at once, the rest queued) and, behind them, one image blob: the
    blob's request never waits for a fetch, because decoding threads never wait on the network."""
    release, started = threading.Event(), []

    def slow_fetch():
        started.append(1)
        release.wait(60)
        return b'not an image'

    pipeline = EncodePipeline(tiny_backend, minibatch_size=4, num_workers=2, fetch_threads=12)
    try:
        with ThreadPoolExecutor(2) as requests:
            slow = requests.submit(
                pipeline.encode_images, [ImageSource(decode=lambda data: _pixels(tiny_backend), fetch=slow_fetch)] * 12
            )
            wait_until(
                lambda: len(started) == 4, "the slow request's fetches have started (its budget lets 4 run at once)"
            )
            began = time.monotonic()
            fast = pipeline.encode_images([lambda: _pixels(tiny_backend)])
            fast_seconds = time.monotonic() - began
            release.set()
            assert fast.indices == [0] and fast_seconds < 30  # the slow fetches hold for 60 s
            assert len(slow.result(10).indices) == 12  # decoded once fetched: the decoder here ignores the bytes
    finally:
        release.set()
        pipeline.close()


def test_a_requests_fetches_stay_within_its_budget(tiny_backend):
    running, most = [0], [0]
    lock = threading.Lock()

    def fetch():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return b'x' * 1000

    budget = FetchBudget(seconds=0.4, max_bytes=5500, concurrency=3)
    pipeline = EncodePipeline(tiny_backend, minibatch_size=4, fetch_threads=16, fetch_budget=budget)
    try:
        result = pipeline.encode_images([ImageSource(decode=lambda data: _pixels(tiny_backend), fetch=fetch)] * 40)
    finally:
        pipeline.close()
    reasons = [reason for _, reason in result.failures]
    assert most[0] == 3  # never more fetches at once than the budget's concurrency
    assert len(result.indices) == 5 and any('more than 5500 bytes' in r for r in reasons)  # the bytes budget
    assert len(result.indices) + len(result.failures) == 40


def test_the_time_budget_fails_the_fetches_it_did_not_reach(tiny_backend):
    def fetch():
        time.sleep(0.1)
        return b'x'

    pipeline = EncodePipeline(tiny_backend, minibatch_size=4, fetch_budget=FetchBudget(seconds=0.25, concurrency=1))
    try:
        result = pipeline.encode_images([ImageSource(decode=lambda data: _pixels(tiny_backend), fetch=fetch)] * 10)
    finally:
        pipeline.close()
    assert 1 <= len(result.indices) <= 4 and any('time for fetching images' in r for _, r in result.failures)


def test_decoded_images_waiting_for_the_model_stay_within_the_room():
    room = Room(8)
    room.take(6)
    taken = threading.Event()
    threading.Thread(target=lambda: (room.take(4), taken.set()), daemon=True).start()
    assert not taken.wait(0.2)  # 6 + 4 > 8: waits
    room.give(6)
    assert taken.wait(2) and room.free == 4
    with pytest.raises(DeadlineExceededError):
        room.take(8, deadline=time.monotonic() + 0.05)


def test_room_goes_first_to_the_request_that_had_least_then_to_the_smallest():
    """Eight-image requests wait for room, then a one-image request arrives: it is served first; then the
    newcomers' first minibatches go before a large request's second one; a waiter past its deadline leaves
    the line without blocking the others."""
    room = Room(8)
    room.take(8)
    order, threads = [], []

    def waiter(name, rows, had=0):
        room.take(rows, had=had)
        order.append(name)

    for name, rows, had in [('large-2nd', 8, 8), ('large-a', 8, 0), ('large-b', 8, 0), ('small', 1, 0)]:
        threads.append(threading.Thread(target=waiter, args=(name, rows, had), daemon=True))
        threads[-1].start()
        wait_until(lambda: room.waiting == len(threads), f'{name} waits')  # arrival order: the small one asks last
    with pytest.raises(DeadlineExceededError):
        room.take(1, deadline=time.monotonic() + 0.05)
    for served in range(1, 5):
        room.give(8)
        wait_until(lambda: len(order) == served, f'{served} waiters served')
    for thread in threads:
        thread.join(2)
    assert order == ['small', 'large-a', 'large-b', 'large-2nd']


def test_room_comes_back_image_by_image_as_the_model_runs_them(tiny_backend):
    """Two 8-image requests share forward passes, 4 images each: the 8 images a pass ran give their room
    back at once, though neither request is done (room held until a whole minibatch had run would wait
    for the slowest of the requests it was interleaved with)."""

    class Gated(RecordingBackend):
        def encode_images(self, pixels):
            free_at_start.append(pipeline._room.free)
            go.wait(60)
            return super().encode_images(pixels)

    free_at_start, go = [], threading.Event()
    pipeline = EncodePipeline(Gated(tiny_backend), minibatch_size=8)
    pixels = _pixels(tiny_backend)
    try:
        with ThreadPoolExecutor(3) as requests:
            blocker = requests.submit(pipeline.encode_images, [lambda: pixels], request='blocker')
            wait_until(lambda: free_at_start, 'its one image holds the model thread at the gate')
            both = [requests.submit(pipeline.encode_images, [lambda: pixels] * 8, request=r) for r in 'ab']
            queued = pipeline.scheduler.waiting_rows
            wait_until(lambda: queued().get('images') == 16, "both requests' images are decoded and queued")
            go.set()
            results = [f.result(10) for f in [blocker, *both]]
    finally:
        pipeline.close()
    assert [r.indices for r in results] == [[0], list(range(8)), list(range(8))]
    capacity = pipeline._room.capacity
    assert free_at_start[:3] == [capacity - 1, capacity - 16, capacity - 8]


def test_a_small_newcomer_takes_the_reserve_when_the_room_is_full():
    """A one-image request that has had no room goes ahead at once, within a reserve of 3 rows beyond the room;
    a large newcomer, a small request's later minibatch and a newcomer past the reserve wait for room."""
    room = Room(8, reserve=3, small=SmallRequests(documents=2))
    room.take(8)
    room.take(1, had=0)
    room.take(2, had=0)
    assert room.free == -3
    for rows, had in [(1, 0), (4, 0), (1, 5)]:
        with pytest.raises(DeadlineExceededError):
            room.take(rows, deadline=time.monotonic() + 0.05, had=had)
    room.give(3)
    room.take(2, had=0)  # the reserve it gave back
    room.give(2)
    room.give(8)
    assert room.free == 8
