"""Where clipserve keeps downloaded weights and exported models."""

from __future__ import annotations

import os
from pathlib import Path

from clipserve import environment

CACHE_ENV = environment.CACHE.name


def cache_dir() -> Path:
    """`$CLIPSERVE_CACHE`, else `$XDG_CACHE_HOME/clipserve`, else `~/.cache/clipserve`."""
    explicit = environment.CACHE.value()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(base).expanduser() / 'clipserve'
