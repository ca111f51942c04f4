"""How long a forward pass that is not full waits for requests expected back: the rule, apart from the queue.

Clients that send their next request when the last is answered (most pipelines, most benchmarks) are away while
their answer travels back and their next request comes in. A replica that answers half of them while the other
half wait settles into passes of half the clients each: twice as many passes of half the rows, each sharing the
CPU with the other half's requests in transit. So a pass waits while fewer requests wait for it than were around
the last pass of its kind (in it, or queued when it ended), at most a share of that last pass's own time: passes
that are short, as on a GPU, never wait long beside them. Requests expected back come soon after the pass: one
that comes later than a whole pass's time after it (the first after a pause) does not wait. When the expected
requests do not come (the clients stopped), one pass waits, and the next expectation is taken from that pass. A
lone client's requests never wait, nor does a small newcomer's short pass (engine/small_requests.py). (The
scheduler's other wait, for requests admitted to the replica and not yet queued, is `batch_wait_ms`.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

SHARE_OF_PASS = 0.25  # the most a pass waits for expected requests, as a share of the last pass's time


@dataclass
class ExpectedRequests:
    share_of_pass: float = SHARE_OF_PASS  # 0: never wait
    expected: dict[str, int] = field(default_factory=dict)  # per kind: requests around its last pass
    last_pass: dict[str, tuple[float, float]] = field(default_factory=dict)  # per kind: (seconds, ended at)

    def after_pass(self, kind: str, requests_around: int, seconds: float, ended: float) -> None:
        """A pass of `kind` ran for `seconds` until `ended` (time.monotonic()); `requests_around`: the requests in
        it or waiting for `kind` when it ended."""
        self.expected[kind] = requests_around
        self.last_pass[kind] = (seconds, ended)

    def allowed(self, kind: str, requests_waiting: int, now: float) -> float:
        """Seconds a pass of `kind` that is not full may wait in all, deciding at `now` with `requests_waiting`
        waiting for it."""
        seconds, ended = self.last_pass.get(kind, (0.0, 0.0))
        if requests_waiting < self.expected.get(kind, 0) and now - ended <= seconds:
            return self.share_of_pass * seconds
        return 0.0
