"""Server-side files, when the operator allows them: only regular files, optionally only under one
directory, never more than the size cap (st_size is not trusted: it is 0 in /proc)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from clipserve.inputs.data_uris import UriError

_NOT_REGULAR = 'not a regular file on the server (directories, devices and pipes are refused)'


def read_file(path: str, max_bytes: int, root: str | None = None) -> bytes:
    """The bytes of the regular file `path` (under `root` when given), at most `max_bytes`, or UriError."""
    real = Path(os.path.realpath(os.path.expanduser(path)))
    if root is not None:
        root_path = Path(os.path.realpath(os.path.expanduser(root)))
        if real != root_path and root_path not in real.parents:
            raise UriError(f'the file is outside the directory this server may read ({root_path})')
    try:
        # stat before opening: opening a FIFO blocks and opening a device can have side effects.
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise UriError(_NOT_REGULAR)
        # O_NONBLOCK: should the path have become a FIFO since the stat, open must not block;
        # O_NOFOLLOW: nor may its last component have become a symlink out of the root.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0))
        with open(fd, 'rb') as f:
            status = os.fstat(f.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise UriError(_NOT_REGULAR)
            if status.st_size > max_bytes:  # believed when it is too large, never when it is small
                raise UriError(f'the file is larger than the limit of {max_bytes} bytes')
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise UriError('no such file on the server') from None
    except OSError as e:
        raise UriError(f'cannot read the file on the server: {e.strerror or type(e).__name__}') from None
    if len(data) > max_bytes:
        raise UriError(f'the file is larger than the limit of {max_bytes} bytes')
    return data
