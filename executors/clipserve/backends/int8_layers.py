"""Which linear layers an int8 model keeps in float, the same for every backend that quantizes.

The first transformer block's and the last layer (the projection to the embedding) stay float: their rounding
moves rankings most (the last step of an embedding is not averaged over tokens; the first block reads the raw
token and patch embeddings), and they are a small share of the work. docs/concepts/precision.md has the
measurement.
"""

from __future__ import annotations


def float_layers(shapes: list[tuple[int, ...]]) -> set[int]:
    """Which of the linear layers (their weight shapes, [in, out], in graph order) stay float: the last one
    and the first block's, a block being the shortest run of shapes that repeats from the start over at least
    half of the layers (4 for CLIP's fused qkv, out, fc1, fc2; 6 with separate q, k, v). No such run: the last.
    """
    count = len(shapes)
    kept = {count - 1} if count else set()
    for length in range(2, count // 2 + 1):
        repeats = 1
        while shapes[repeats * length : (repeats + 1) * length] == shapes[:length]:
            repeats += 1
        if repeats >= 2 and repeats * length * 2 >= count:
            return kept | set(range(length))
    return kept
