"""Ray Data in a process that also has pydantic 1 (which clipserve's Jina HTTP gateway needs).

Ray 2.60 refuses pydantic 1 when its compatibility module is imported (`ray._common.pydantic_compat`
raises ImportError), and Ray Data imports that module on its first DataContext, although Ray Data itself
never uses pydantic: Ray's minimal install (no pydantic at all) runs it. So, in the driver and, through
the job's `worker_process_setup_hook`, in every worker before its first task, that one module is imported
while pydantic is hidden (`sys.modules['pydantic'] = None`, Python's documented way to make an import
fail): it then takes the minimal-install path, and pydantic 1 is put back for everyone else. Where
pydantic 2 or no pydantic is installed this does nothing.

Ray's own cluster processes (`ray start`: the dashboard, the agents) cannot be helped this way; start them
from an environment without pydantic 1 (e.g. `pip install ray==2.60.0` in a venv of its own): the job's
workers still run clipserve's Python, which the driver names as the job's `py_executable`.
"""

from __future__ import annotations

import sys

COMPAT = 'ray._common.pydantic_compat'
_MISSING = object()


def pydantic_major() -> int | None:
    """pydantic's major version as installed here (None: not installed), without importing Ray."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return int(version('pydantic').split('.')[0])
    except (PackageNotFoundError, ValueError):
        return None


def hide_pydantic_v1_from_ray() -> None:
    """Import Ray's pydantic compatibility module as a minimal install would, when pydantic 1 is installed."""
    if COMPAT in sys.modules or pydantic_major() != 1:
        return
    saved = sys.modules.get('pydantic', _MISSING)
    sys.modules['pydantic'] = None  # type: ignore[assignment]
    try:
        __import__(COMPAT)
    finally:
        if saved is _MISSING:
            del sys.modules['pydantic']
        else:
            sys.modules['pydantic'] = saved


def worker_setup() -> None:
    """The job's worker_process_setup_hook (runs in each worker before its first task)."""
    hide_pydantic_v1_from_ray()
