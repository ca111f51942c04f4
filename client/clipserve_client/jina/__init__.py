"""clipserve_client.jina: the Jina-protocol client (gRPC, HTTP /post, WebSocket; DocumentArray in and out).

    pip install 'clipserve-client[jina]'

    from clipserve_client.jina import Client
    Client('grpc://127.0.0.1:51000').encode(['a photo of a dog', 'dog.jpg'])

clip-client 0.8.3's methods, arguments and return types, minus its defects. It needs jina, docarray (v1)
and pydantic 1, which is why it is an extra: the default install (clipserve_client.Client) speaks the
OpenAI-compatible HTTP routes with httpx and lives next to pydantic 2.
"""

from clipserve_client._version import __version__
from clipserve_client.jina.client import Client
from clipserve_client.jina.errors import FetchError, ServerError

__all__ = ['Client', 'FetchError', 'ServerError', '__version__']
