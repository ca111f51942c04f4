"""clipserve_client: a light client of clipserve's OpenAI-compatible HTTP routes (httpx and numpy only).

    from clipserve_client import Client
    with Client('http://127.0.0.1:51001') as client:
        vectors = client.encode(['a photo of a dog', Path('dog.jpg')])   # float32 [2, D], L2-normalised
        result = client.encode_partial(paths)     # a bad image costs its own row: result.failed names it
        scores = client.rank('a dog', [Path('dog.jpg'), Path('car.jpg')])
        found = client.search('a dog on a beach', top_k=5)               # flows/search.yml
        best = client.rerank('capital of France?', ['Paris is...', 'Berlin is...'])   # flows/rerank.yml

`AsyncClient` has the same calls, awaitable. No jina, docarray, grpc, pydantic or torch: it installs next to
FastAPI, LangChain or any pydantic-2 application. The Jina-protocol client (gRPC, WebSocket, DocumentArray
in and out) is `clipserve_client.jina`, from `pip install 'clipserve-client[jina]'`.
"""

from clipserve_client._version import __version__
from clipserve_client.async_client import AsyncClient
from clipserve_client.client import Client
from clipserve_client.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ClipServeClientError,
    FetchError,
    InternalServerError,
    ItemError,
    NotFoundError,
    RateLimitError,
    RequestTooLargeError,
    UnexpectedAnswerError,
)
from clipserve_client.partial import Encoded
from clipserve_client.wire import Found, Model, Reranked

__all__ = [
    'APIConnectionError',
    'APIStatusError',
    'APITimeoutError',
    'AsyncClient',
    'AuthenticationError',
    'BadRequestError',
    'Client',
    'Encoded',
    'Found',
    'Reranked',
    'ClipServeClientError',
    'FetchError',
    'InternalServerError',
    'ItemError',
    'Model',
    'NotFoundError',
    'RateLimitError',
    'RequestTooLargeError',
    'UnexpectedAnswerError',
    '__version__',
]
