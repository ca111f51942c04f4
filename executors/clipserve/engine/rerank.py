"""A query's documents scored by a cross-encoder, with every other request's pairs batched together.

Each (query, document) pair is tokenized (models/cross_encoder.PairTokenizer), the pairs are sorted by length
and cut into minibatches trimmed to their longest pair, and the minibatches go to the scheduler's one model
thread (engine/scheduler.py), where concurrent requests' pairs share forward passes (dynamic batching) and a
large request is interleaved with everyone else's. A pair's score does not depend on what shares its batch:
padding is masked. `relevance_score` is the sigmoid of the model's logit (what sentence-transformers'
CrossEncoder, TEI and Infinity answer for a one-label reranker); the logit itself is `raw_score`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import numpy as np

from clipserve.backends.cross_encoder import CrossEncoder
from clipserve.engine.scheduler import Scheduler, Task
from clipserve.errors import InvalidDocumentError
from clipserve.models.cross_encoder import PairTokenizer


@dataclass(frozen=True)
class PairScores:
    raw: np.ndarray  # [N] the model's logits
    tokens: int  # tokens of every pair, as the model saw them (special tokens included)
    truncated: int  # pairs cut to max_length

    @property
    def relevance(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.raw.astype(np.float64)))


class RerankPipeline:
    """Scores pairs for one reranker replica: the tokenizer, and the scheduler that runs every forward pass."""

    def __init__(
        self,
        encoder: CrossEncoder,
        minibatch_size: int = 32,
        batch_wait: float | None = None,
        others_in_flight: Callable[[], bool] = lambda: False,
    ):
        self.encoder = encoder
        self.tokenizer = PairTokenizer(encoder.spec)
        self.minibatch_size = minibatch_size
        task = Task(lambda *arrays: encoder.score(*arrays)[:, None], minibatch_size, pad_columns=True)
        self.scheduler = Scheduler({'pairs': task}, batch_wait, others_in_flight, name='clipserve-rerank')

    def score(
        self,
        query: str,
        documents: list[str],
        max_length: int | None = None,
        direction: str = 'right',
        truncate: bool = True,
        request: Hashable = None,
        deadline: float | None = None,
        names: list[str] | None = None,
    ) -> PairScores:
        """Every (query, document) pair's score. `truncate=False`: pairs longer than max_length are an
        InvalidDocumentError naming them (`names`: how the request calls each document)."""
        pairs = self.tokenizer(query, documents, max_length, direction)
        if not truncate and pairs.truncated.any():
            limit = min(max_length or self.encoder.spec.max_length, self.encoder.spec.max_length)
            names = names or [f'document {i}' for i in range(len(documents))]
            raise InvalidDocumentError(
                [
                    (names[i], f'with the query it is longer than {limit} tokens (send truncate: true to cut it)')
                    for i in np.flatnonzero(pairs.truncated)
                ],
                'scored',
            )
        request = request if request is not None else object()
        order = np.argsort(pairs.lengths, kind='stable')
        chunks = [order[i : i + self.minibatch_size] for i in range(0, len(order), self.minibatch_size)]
        futures = []
        for n, rows in enumerate(chunks):
            width = int(pairs.lengths[rows].max())
            arrays = [a[:, :width] for a in pairs.rows(rows)]
            futures.append(
                self.scheduler.submit(
                    'pairs', *arrays, request=request, deadline=deadline, served=n * self.minibatch_size
                )
            )
        raw = np.empty(len(documents), dtype=np.float32)
        try:
            for rows, future in zip(chunks, futures):
                raw[rows] = future.result()[:, 0]
        finally:
            for future in futures:
                future.cancel()  # after a failure: what has not run is not run
        return PairScores(raw, int(pairs.lengths.sum()), int(pairs.truncated.sum()))

    def close(self) -> None:
        self.scheduler.close()
        self.encoder.close()
