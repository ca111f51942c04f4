"""Comparing embeddings so that a test means the same on every CPU: errors relative to the vectors' norms
(or cosines), never absolute tolerances on vectors whose scale depends on the model.

Different CPUs (AVX2, AVX-512) and batch sizes sum in different orders, so float32 embeddings of the same
input differ in their last bits; what is the same everywhere is the error relative to the vector's length.
"""

import numpy as np


def relative_error(got, want) -> float:
    """The largest ||got_i - want_i|| / ||want_i|| over the rows (a zero row counts its plain error)."""
    got, want = np.atleast_2d(np.asarray(got, np.float64)), np.atleast_2d(np.asarray(want, np.float64))
    assert got.shape == want.shape, f'shapes differ: {got.shape} vs {want.shape}'
    norms = np.linalg.norm(want, axis=-1)
    errors = np.linalg.norm(got - want, axis=-1)
    return float(np.max(errors / np.where(norms > 0, norms, 1.0))) if got.size else 0.0


def assert_close(got, want, rel: float = 1e-5) -> None:
    """Each row of `got` within `rel` of `want`'s row, relative to its norm."""
    error = relative_error(got, want)
    assert error <= rel, f'relative error {error:.3g} > {rel:g}'


def cosines(a, b) -> np.ndarray:
    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def assert_cosine(got, want, minimum: float) -> None:
    """Every row of `got` points where `want`'s does, up to `minimum` cosine."""
    worst = float(cosines(got, want).min())
    assert worst >= minimum, f'min cosine {worst:.6f} < {minimum}'
