"""Where clipserve keeps downloaded weights and exported models."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = 'CLIPSERVE_CACHE'


def cache_dir() -> Path:
    """`$CLIPSERVE_CACHE`, else `$XDG_CACHE_HOME/clipserve`, else `~/.cache/clipserve`."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(base).expanduser() / 'clipserve'
