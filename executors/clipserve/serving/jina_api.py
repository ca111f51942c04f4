"""Jina's public API that clipserve's executors are built on, imported here once: `Executor` (the base every
replica, indexer and reranker extends) and `requests` (how an endpoint is bound). Jina's internals are
jina_compat.py's and jina_gateway.py's."""

from jina import Executor, requests

__all__ = ['Executor', 'requests']
