"""Multi-vector embeddings in fewer bytes: float16, or int8 with one scale per vector.

- `fp16`: half the bytes of float32; a unit vector's components round at ~5e-4 relative;
- `int8`: a quarter of the bytes (plus 4 per vector for its scale): each vector is scaled so that its
  largest component is 127 and rounded (symmetric, per vector, as vector stores' scalar quantization does).

`store` / `load` are the two directions; MaxSim runs on what `load` gives back (float32). Their effect on
rankings (top-10 agreement with float32) is measured by benchmarks/late_interaction.py and reported in
docs/late-interaction.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STORAGE_DTYPES = ('fp32', 'fp16', 'int8')


@dataclass(frozen=True)
class StoredVectors:
    """One document's vectors as stored: `values` [T, D] in the storage dtype, and int8's scales [T]."""

    values: np.ndarray
    scales: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + (self.scales.nbytes if self.scales is not None else 0))


def store(vectors: np.ndarray, dtype: str) -> StoredVectors:
    """[T, D] float vectors in `dtype` ('fp32', 'fp16' or 'int8')."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if dtype == 'fp32':
        return StoredVectors(vectors.copy())
    if dtype == 'fp16':
        return StoredVectors(vectors.astype(np.float16))
    if dtype == 'int8':
        peak = np.abs(vectors).max(axis=-1)
        scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        values = np.clip(np.rint(vectors / scales[..., None]), -127, 127).astype(np.int8)
        return StoredVectors(values, scales)
    raise ValueError(f'storage dtype must be one of {", ".join(STORAGE_DTYPES)}, got {dtype!r}')


def load(stored: StoredVectors) -> np.ndarray:
    """The stored vectors back as float32 [T, D]."""
    values = stored.values.astype(np.float32)
    return values * stored.scales[..., None] if stored.scales is not None else values
