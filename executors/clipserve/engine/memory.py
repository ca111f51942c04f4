"""Hand memory freed after a forward pass back to the operating system.

glibc keeps what a thread frees in that thread's malloc arena for reuse. A replica's forward
passes, decoders and request threads each allocate tens of megabytes at a time, so the freed
space piles up in several arenas and the replica's resident memory creeps towards the sum of their
peaks. `malloc_trim` returns the free pages of every arena; it costs well under a millisecond
next to a forward pass that takes tens. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform


def _malloc_trim():
    if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6').malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


def release_free_memory() -> bool:
    """Return freed heap pages to the OS; True where that is possible (glibc)."""
    if _trim is None:
        return False
    _trim(0)
    return True
