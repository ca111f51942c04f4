"""A reranker in a reduced precision (bf16, fp16, int8) serves only after it is measured against fp32 on the
CPU it runs on, as the encoders' int8 is (int8_check.py): the same generated (query, document) pairs through
both. It fails when a relevance score drifts past MAX_SCORE_DIFF or a query's best three documents change
order: a precision the operator asked for is then refused at start, with the figures (CLIPSERVE_INT8_FORCE=1
serves it anyway, logged); one `auto` chose falls back to fp32. The pairs are synthetic: the check catches
broken arithmetic, not the accuracy a trained model loses on real data."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from clipserve import environment
from clipserve.backends.cpu_features import cpu_features
from clipserve.backends.int8_check import CAPTIONS, FORCE_ENV
from clipserve.errors import BackendUnavailableError

MAX_SCORE_DIFF = 0.02  # on relevance scores (0-1)
QUERIES = ('a dog playing in the snow', 'what is a neural network?', 'city lights at night')


@dataclass(frozen=True)
class RerankPrecisionReport:
    dtype: str
    max_score_diff: float
    top3_kept: bool
    speedup: float
    cpu: str

    @property
    def failures(self) -> list[str]:
        found = []
        if self.max_score_diff > MAX_SCORE_DIFF:
            found.append(
                f'relevance scores drift from fp32 (max difference {self.max_score_diff:.4f} > {MAX_SCORE_DIFF})'
            )
        if not self.top3_kept:
            found.append("a query's best three documents change order")
        return found

    def describe(self) -> str:
        return (
            f'int8 against fp32 on this CPU ({self.cpu}): max relevance difference {self.max_score_diff:.4f}, '
            f'best three {"kept" if self.top3_kept else "changed"}, {self.speedup:.2f}x fp32'
        )


def check_precision(tokenizer, reduced, fp32) -> RerankPrecisionReport:
    """A reduced-precision reranker (CrossEncoder) against the fp32 one of the same checkpoint on QUERIES x
    CAPTIONS, through `tokenizer`."""
    diffs, kept, times = [], True, {'reduced': 0.0, 'fp32': 0.0}
    for query in QUERIES:
        pairs = tokenizer(query, list(CAPTIONS))
        arrays = pairs.rows(slice(None))
        scores = {}
        for name, model in (('fp32', fp32), ('reduced', reduced)):
            model.score(*arrays)  # warm
            started = time.perf_counter()
            scores[name] = 1 / (1 + np.exp(-model.score(*arrays).astype(np.float64)))
            times[name] += time.perf_counter() - started
        diffs.append(float(np.abs(scores['reduced'] - scores['fp32']).max()))
        kept = kept and list(np.argsort(-scores['reduced'])[:3]) == list(np.argsort(-scores['fp32'])[:3])
    speedup = times['fp32'] / max(times['reduced'], 1e-9)
    return RerankPrecisionReport(reduced.dtype, max(diffs), kept, speedup, cpu_features().describe())


def forced(environ=None) -> bool:
    return environment.INT8_FORCE.on(environ)


def refusal(report: RerankPrecisionReport) -> BackendUnavailableError:
    return BackendUnavailableError(
        f'dtype {report.dtype} for this reranker is refused on this CPU: {"; ".join(report.failures)}. Measured: '
        f'{report.describe()}. Serve fp32, or set {FORCE_ENV}=1 to serve {report.dtype} anyway.'
    )
