"""Apply one answer: fill the caller's documents, then run the callbacks, as clip-client's order has it."""

from __future__ import annotations

from typing import Callable, Optional

from jina.proto import jina_pb2
from jina.types.request.data import DataRequest

from clipserve_client.jina.errors import ServerError
from clipserve_client.jina.methods import Method, Results
from clipserve_client.jina.progress import ProgressBar

Callback = Optional[Callable[[DataRequest], None]]


class AnswerHandler:
    """Called with (batch, response) for every answer, in the calling task, one at a time.

    A failed answer raises ServerError unless `on_error` is given. Callbacks see the caller's ids.
    """

    def __init__(
        self,
        method: Method,
        results: Results,
        progress: ProgressBar,
        on_done: Callback,
        on_error: Callback,
        on_always: Callback,
    ):
        self.method, self.results, self.progress = method, results, progress
        self.on_done, self.on_error, self.on_always = on_done, on_error, on_always

    def __call__(self, batch, response: DataRequest) -> None:
        failed = response.header.status.code >= jina_pb2.StatusProto.ERROR
        items = {item.wire.id: item for item in batch.items}
        answers = [(items.get(answer.id), answer) for answer in response.docs]
        if not failed:
            self._fill(items, answers)
        if self.on_done or self.on_error or self.on_always:
            for item, answer in answers:
                if item is not None:
                    self.method.restore_ids(item, answer)
        if failed:
            if self.on_error is None:
                raise ServerError(response)
            self.on_error(response)
        elif self.on_done is not None:
            self.on_done(response)
        if self.on_always is not None:
            self.on_always(response)
        self.progress.advance(len(batch.items))

    def _fill(self, items: dict, answers: list) -> None:
        for item, answer in answers:
            if item is not None:  # an answer the server added on its own is left alone
                self.method.fill(item, answer, self.results)
        if self.method.strict:
            missing = set(items) - {answer.id for _, answer in answers}
            if missing:
                first = min(items[wire_id].position for wire_id in missing)
                raise ValueError(f'the server returned no answer for input {first} ({len(missing)} input(s) missing)')
