"""What one input becomes, decided once when the engine is built on a model: one vector (CLIP, SigLIP), or a
vector per token (late interaction: ColPali, ColQwen2). The layers above call the kind's methods instead of
testing a flag: how a batch's output becomes each input's embedding, which kept embeddings can be ranked, and
how a query's matches are scored and ordered (softmax of 100 x cosine as clip-as-service, or MaxSim).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clipserve.engine import ranking
from clipserve.engine.token_vectors import as_vectors, token_rows

MAXSIM_SCORE = 'maxsim_score'


@dataclass(frozen=True)
class Ranked:
    """A query's matches scored: each match's scores by name (None: not given by this model), and the
    matches' order, best first."""

    scores: list[dict[str, float | None]]
    order: list[int]


class OneVector:
    """One vector per input, ranked by clip_score (softmax over the query's matches) and its cosine; a SigLIP
    model's matches also get siglip_score, the model's own probability."""

    score_names = ('clip_score', 'clip_score_cosine', 'siglip_score')

    def rows(self, out: np.ndarray) -> np.ndarray:
        """A batch's output as the inputs' embeddings: [N, D], as the model gives it."""
        return out

    def stored_problem(self, embedding, dim: int) -> str | None:
        """Why a kept embedding cannot be ranked by this model, or None."""
        size = np.asarray(embedding).size
        return None if size == dim else f'embedding has dimension {size}, the model gives {dim}'

    def rank(self, query, matches: list, sigmoid_logits: tuple[float, float] | None = None) -> Ranked:
        candidates = np.stack([np.asarray(m, dtype=np.float32).reshape(-1) for m in matches])
        probabilities, cosines = ranking.clip_scores(np.asarray(query).reshape(-1), candidates)
        sigmoids = ranking.sigmoid_scores(cosines, *sigmoid_logits) if sigmoid_logits else [None] * len(matches)
        scores = [
            {'clip_score': float(p), 'clip_score_cosine': float(c), 'siglip_score': None if s is None else float(s)}
            for p, c, s in zip(probabilities, cosines, sigmoids)
        ]
        return Ranked(scores, [int(i) for i in ranking.descending_order(probabilities)])


class TokenVectors:
    """A [tokens, D] array per input (its padding rows dropped), ranked by MaxSim against the query's."""

    score_names = (MAXSIM_SCORE,)

    def rows(self, out: np.ndarray) -> list[np.ndarray]:
        """A batch's output [N, T, D] as the inputs' embeddings: N arrays [tokens_i, D]."""
        return token_rows(out)

    def stored_problem(self, embedding, dim: int) -> str | None:
        try:
            as_vectors(embedding, dim)
        except ValueError as e:
            return str(e)
        return None

    def rank(self, query, matches: list, sigmoid_logits=None) -> Ranked:
        dim = np.asarray(query).shape[-1]
        scores = ranking.maxsim_scores(as_vectors(query, dim), [as_vectors(m, dim) for m in matches])
        return Ranked([{MAXSIM_SCORE: float(s)} for s in scores], [int(i) for i in ranking.descending_order(scores)])


def output_kind(backend) -> OneVector | TokenVectors:
    """The ranking strategy of a loaded model's output (models/outputs.py: one vector, or a vector per token)."""
    return TokenVectors() if backend.output.late_interaction else OneVector()
