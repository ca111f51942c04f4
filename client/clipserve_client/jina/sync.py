"""Run a coroutine to completion from synchronous code."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_sync(coroutine):
    """Each call gets its own event loop, so calls from several threads never share one.

    Inside a running loop (a notebook, an async web handler) the call runs on a helper thread,
    since that loop cannot be blocked on.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix='clipserve-client') as pool:
        return pool.submit(asyncio.run, coroutine).result()
