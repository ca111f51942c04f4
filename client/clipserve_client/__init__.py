"""clipserve_client: a light client for clipserve (and clip-as-service) Flows.

    from clipserve_client import Client
    Client('grpc://127.0.0.1:51000').encode(['a photo of a dog', 'dog.jpg'])

Depends on jina and docarray (v1) only: no torch, no server code.
"""

from clipserve_client.client import Client
from clipserve_client.errors import FetchError, ServerError

__all__ = ['Client', 'FetchError', 'ServerError', '__version__']


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version('clipserve')
    except PackageNotFoundError:
        return 'unknown'


__version__ = _version()
