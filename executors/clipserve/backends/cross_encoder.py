"""Rerankers (cross-encoders) on a runtime: one small interface, `score(*token arrays) -> logits [N]`.

The arrays are a PairBatch's (models/cross_encoder.py), in the model's input order: input_ids, attention_mask
and, for BERT-style models, token_type_ids. `clipserve.backends.create_cross_encoder` builds one, importing
its runtime only then.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from clipserve.errors import InvalidParameterError
from clipserve.models.cross_encoder import CrossEncoderSpec

#: precisions by backend (any but fp32 is measured against fp32 at start: backends/rerank_check.py)
DTYPES = {'torch': ('fp32', 'bf16', 'fp16'), 'onnx': ('fp32', 'int8')}


@dataclass(frozen=True)
class RerankOptions:
    device: str = 'cpu'
    dtype: str | None = None  # None: fp32 (fp16 on CUDA)
    num_threads: int | None = None


class CrossEncoder(ABC):
    """One loaded reranker; `model_calls` counts forward passes."""

    name: str
    spec: CrossEncoderSpec
    device: str
    dtype: str

    def __init__(self):
        self.model_calls = 0

    def score(self, *arrays: np.ndarray) -> np.ndarray:
        self.model_calls += 1
        return np.asarray(self._score(*arrays), dtype=np.float32).reshape(-1)

    @abstractmethod
    def _score(self, *arrays: np.ndarray) -> np.ndarray: ...

    def close(self) -> None:
        pass

    def describe(self) -> str:
        return (
            f'{self.spec.name} on {self.name} ({self.device}, {self.dtype}), pairs up to {self.spec.max_length} tokens'
        )


def pick_dtype(backend: str, device: str, dtype: str | None) -> str:
    """`dtype`, checked; unset (`auto`): fp16 on CUDA (torch), bf16 on a CPU that computes it natively (torch:
    3x fp32 there, benchmarks/rerank.py), else fp32."""
    if dtype in (None, '', 'auto'):
        if device.startswith('cuda'):
            return 'fp16' if backend == 'torch' else 'fp32'
        from clipserve.backends.precision import cpu_bf16

        return 'bf16' if backend == 'torch' and cpu_bf16()[0] else 'fp32'
    if dtype not in DTYPES[backend]:
        raise InvalidParameterError(
            f'dtype {dtype!r} is not served by the {backend} reranker; it takes {", ".join(DTYPES[backend])}'
        )
    return dtype
