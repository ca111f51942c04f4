"""The JSON files that come with model folders (configs, tokenizer and processor settings), read with
an error that names the file."""

from __future__ import annotations

import json
from pathlib import Path


def read_json_object(path: Path, error: type[Exception], missing_ok: bool = True) -> dict:
    """The JSON object in `path`: {} when the file is missing (and `missing_ok`) or holds no object;
    unreadable or invalid JSON raises `error` naming the file."""
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError) as e:
        raise error(f'{str(path)!r} is not readable JSON: {e}') from e
    return data if isinstance(data, dict) else {}
