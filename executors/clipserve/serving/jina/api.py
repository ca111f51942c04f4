"""Jina's public API that clipserve's executors are built on, imported here once: `Executor` (the base every
replica, indexer and reranker extends) and `requests` (how an endpoint is bound). Jina's internals are
compat.py's and gateway_hooks.py's."""

from jina import Executor, requests

# the arguments Jina's Executor takes itself; every other `with:` key is an executor's setting
JINA_ARGUMENTS = ('metas', 'requests', 'runtime_args', 'workspace', 'dynamic_batching')

__all__ = ['Executor', 'JINA_ARGUMENTS', 'requests']
