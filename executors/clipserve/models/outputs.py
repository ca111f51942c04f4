"""What one input's embedding is, as a model's config declares it; decided once, when the model resolves.

One vector per input (CLIP, SigLIP), or late interaction (ColPali, ColQwen2): a vector per token, a [tokens, D]
array per input. Backends ask it for a row's shape and fit each pass's output to it; the engine builds its
ranking strategy from it (engine/output_kind.py); what writes one vector per input (the in-process Model, bulk
jobs, the ONNX export) reads `late_interaction` once, at load, to refuse such a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

import numpy as np

#: a model config's declaration of late interaction (models/families/late_interaction.py writes it)
CONFIG_KEY = 'multi_vector'


@dataclass(frozen=True)
class OneVectorOutput:
    """One [D] vector per input."""

    late_interaction: ClassVar[bool] = False

    def row_shape(self, kind: str, dim: int, context_length: int) -> tuple[int, ...]:
        """One input's output for `kind` ('images' or 'texts')."""
        return (dim,)

    def fit(self, out: np.ndarray, kind: str, context_length: int) -> np.ndarray:
        """A pass's output as the rows `row_shape` says: [B, D] already."""
        return out


@dataclass(frozen=True)
class TokenVectorsOutput:
    """A [tokens, D] array per input: `image_tokens` rows for an image (the most an image has), the context
    length for a text; an input's padding tokens are zero rows after its own (engine/token_vectors.py drops
    them per document)."""

    image_tokens: int
    late_interaction: ClassVar[bool] = True

    def row_shape(self, kind: str, dim: int, context_length: int) -> tuple[int, ...]:
        return (self.image_tokens if kind == 'images' else context_length, dim)

    def fit(self, out: np.ndarray, kind: str, context_length: int) -> np.ndarray:
        """A pass's [B, T, D] padded with zero rows to its kind's fixed token count (texts run trimmed)."""
        rows = self.row_shape(kind, out.shape[-1], context_length)[0]
        if out.shape[1] > rows:
            raise ValueError(f'the model gave {out.shape[1]} token rows per {kind[:-1]}, over {rows}')
        return np.pad(out, ((0, 0), (0, rows - out.shape[1]), (0, 0))) if out.shape[1] < rows else out


Output = Union[OneVectorOutput, TokenVectorsOutput]


def declared_output(model_cfg: dict) -> Output:
    """The output a model config declares (one vector unless it says late interaction)."""
    if model_cfg.get(CONFIG_KEY):
        return TokenVectorsOutput(int(model_cfg.get('image_tokens') or 0))
    return OneVectorOutput()
