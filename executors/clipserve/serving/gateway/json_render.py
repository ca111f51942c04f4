"""The gateway's JSON answers as bytes, by orjson.

An embedding's float32 numbers are written in their shortest float32 form, the form OpenAI's answers hold,
not as the longer float64 digits of the same value that `json.dumps` writes for Python floats: about half
the bytes to send and to parse, and rendering that no longer takes from the model the cores the gateway
shares with it. A client reading them as float32 gets the very values the encoder answered.

Answers holding few numbers render on the event loop (handing them to a thread costs more than rendering
them); larger ones on a thread, so the event loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio

import numpy as np
import orjson

INLINE_NUMBERS = 1 << 16  # numbers of an answer rendered on the event loop; more go to a thread
OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def render(payload) -> bytes:
    """`payload` (dicts, lists, numbers, strings and numpy arrays) as compact JSON; NaN and infinities, which
    JSON cannot hold, become null."""
    return orjson.dumps(payload, option=OPTIONS)


def numbers_in(payload) -> int:
    """The numbers of the arrays an answer's `data` rows hold (embeddings): what its rendering costs."""
    rows = payload.get('data') if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        return 0
    return sum(
        row['embedding'].size for row in rows if isinstance(row, dict) and isinstance(row.get('embedding'), np.ndarray)
    )


async def rendered(payload) -> bytes:
    """render(payload), on a thread when it holds many numbers."""
    if numbers_in(payload) <= INLINE_NUMBERS:
        return render(payload)
    return await asyncio.to_thread(render, payload)
