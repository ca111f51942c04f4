"""encode_partial: embed a long list where a bad input costs only its own row.

A clipserve server refuses a request whose items include a bad one (an unreadable image, an empty text),
naming each bad item by its position in the error's `items`. The batch is then sent again without them,
so every other input still gets its vector. A refusal that names no item (a server that does not say, or
a request over the server's byte limit) is split in halves until the bad input is alone. Inputs the client
cannot read itself (a missing file) fail here, before sending.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from clipserve_client.errors import APIStatusError

ITEM_STATUSES = (400, 413)  # refusals of what was sent; anything else is the server's or the connection's


@dataclass
class Encoded:
    """What encode_partial answers: the vectors of the inputs that worked and why the others did not."""

    vectors: np.ndarray  # float32 [len(indices), D], L2-normalised, in input order
    indices: list[int]  # each row's position in the inputs
    failed: dict[int, str] = field(default_factory=dict)  # input position -> reason

    def __len__(self) -> int:
        return len(self.indices) + len(self.failed)


class Pieces:
    """One batch, sent until each of its inputs has a vector or a reason: `next()` is the next part to send
    (positions in the batch), `answered` and `refused` what came back for it."""

    def __init__(self, offset: int, prepared: list):
        self.offset = offset
        self.items = prepared
        self.vectors: dict[int, np.ndarray] = {}
        self.failed = {offset + i: str(item) for i, item in enumerate(prepared) if isinstance(item, Exception)}
        sendable = [i for i, item in enumerate(prepared) if not isinstance(item, Exception)]
        self._todo = [sendable] if sendable else []

    def next(self) -> list[int] | None:
        return self._todo.pop(0) if self._todo else None

    def items_of(self, part: list[int]) -> list[dict]:
        return [self.items[i] for i in part]

    def answered(self, part: list[int], rows: np.ndarray) -> None:
        for position, row in zip(part, rows):
            self.vectors[self.offset + position] = row

    def refused(self, part: list[int], error: APIStatusError) -> None:
        """Record the inputs `error` names and queue the rest again; raise an error that is not about inputs."""
        if error.status not in ITEM_STATUSES:
            raise error
        named = {item.index: item.message for item in error.items if 0 <= item.index < len(part)}
        if named:
            for k, reason in named.items():
                self.failed[self.offset + part[k]] = f'the server refused it: {reason}'
            rest = [position for k, position in enumerate(part) if k not in named]
            if rest:
                self._todo.insert(0, rest)
        elif len(part) > 1:
            half = len(part) // 2
            self._todo[:0] = [part[:half], part[half:]]
        else:
            self.failed[self.offset + part[0]] = f'the server refused it: {error.message}'


def gather(pieces: list[Pieces]) -> Encoded:
    """The batches' results as one Encoded, in input order."""
    vectors = {position: row for piece in pieces for position, row in piece.vectors.items()}
    failed = {position: reason for piece in pieces for position, reason in piece.failed.items()}
    indices = sorted(vectors)
    matrix = np.stack([vectors[i] for i in indices]) if indices else np.zeros((0, 0), np.float32)
    return Encoded(matrix.astype(np.float32, copy=False), indices, dict(sorted(failed.items())))
