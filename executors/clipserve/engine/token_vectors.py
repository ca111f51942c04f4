"""Multi-vector (late-interaction) embeddings as arrays: one [tokens, D] array per document.

A multi-vector backend gives a batch as [N, tokens, D] with each row's padding as zero rows (its real
vectors are unit vectors, so a zero row is never one of them); `token_rows` turns that into one array per
document without the padding, which is what documents carry on the wire. `pad_vectors` goes back: arrays
of different lengths as one zero-padded batch with a mask, for batched MaxSim (ranking.py). `as_vectors`
checks what a client sent as a stored multi-vector embedding.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def token_rows(batch: np.ndarray) -> list[np.ndarray]:
    """[N, T, D] with zero rows as padding -> N float32 arrays [tokens_i, D], the zero rows dropped."""
    batch = np.asarray(batch, dtype=np.float32)
    keep = np.any(batch != 0, axis=-1)
    return [np.ascontiguousarray(row[mask]) for row, mask in zip(batch, keep)]


def pad_vectors(arrays: Sequence[np.ndarray], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """N arrays [T_i, D] -> (float [N, max T_i, D] zero padded, bool mask [N, max T_i]: True on real rows)."""
    if not len(arrays):
        raise ValueError('no multi-vector embeddings to pad')
    arrays = [np.asarray(a) for a in arrays]
    if any(a.ndim != 2 or not len(a) for a in arrays):
        raise ValueError('each multi-vector embedding must be a non-empty [tokens, dim] array')
    dims = {a.shape[1] for a in arrays}
    if len(dims) != 1:
        raise ValueError(f'multi-vector embeddings of different dimensions: {sorted(dims)}')
    lengths = np.array([len(a) for a in arrays])
    out = np.zeros((len(arrays), int(lengths.max()), dims.pop()), dtype=dtype)
    mask = np.arange(out.shape[1])[None, :] < lengths[:, None]
    for row, a in zip(out, arrays):
        row[: len(a)] = a
    return out, mask


def as_vectors(embedding, dim: int) -> np.ndarray:
    """A stored multi-vector embedding as float32 [tokens, dim]; ValueError saying what is wrong with it."""
    array = np.asarray(embedding)
    if array.dtype.kind not in 'fiu':
        raise ValueError(f'a multi-vector embedding must be numbers, got dtype {array.dtype}')
    if array.ndim != 2 or array.shape[1] != dim or not len(array):
        raise ValueError(f'embedding has shape {list(array.shape)}; this multi-vector model gives [tokens, {dim}]')
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise ValueError('embedding holds NaN or infinite values')
    return array
