"""HTTP: one POST of the request as JSON to the gateway's /post route per batch.

The docs are read from the JSON answer directly, so jina 3.34's HTTP client bug (answers only in
`resp.direct_docs`, none in `resp.data.docs`) does not arise: the answer handed on has both.
"""

from __future__ import annotations

import json

import aiohttp
import numpy as np
from docarray import DocumentArray
from jina.excepts import BadServerFlow
from jina.types.request.data import DataRequest

from clipserve_client.jina.address import Address
from clipserve_client.jina.errors import RetryableError

_TRANSIENT_STATUS = (429, 502, 503, 504)  # 429: the gateway is overloaded (Retry-After says how long)


class HttpTransport:
    def __init__(self, address: Address, ssl_context, token: str | None):
        self._address = address
        self._url = address.url('/post')
        self._ssl = ssl_context if address.tls else None
        self._headers = {'Authorization': token} if token else None
        self._session = None

    async def __aenter__(self):
        connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else aiohttp.TCPConnector()
        # no total timeout: a big batch on a CPU server may take minutes; the call's own timeout rules
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self._headers)
        return self

    async def __aexit__(self, *exc_info):
        await self._session.close()

    async def send(self, request):
        body = {
            'execEndpoint': request.header.exec_endpoint,
            'parameters': request.parameters,
            'data': request.docs.to_dict(),
        }
        try:
            async with self._session.post(self._url, json=body) as reply:
                status, text, retry_after = reply.status, await reply.text(), reply.headers.get('Retry-After')
        except aiohttp.ClientSSLError as err:
            raise ConnectionError(
                f'TLS with {self._address} failed: {err}. If the server uses a private '
                'certificate authority, pass ca_file='
            ) from err
        except aiohttp.ClientConnectionError as err:
            raise RetryableError(f'{self._address} is unavailable: {err}') from err
        try:
            answer = json.loads(text) if status in (200, 429) else None
        except ValueError:
            answer = None
        if status == 429 and isinstance(answer, dict) and 'header' in answer:
            return _to_request(answer)  # a replica's refusal in Jina's answer: retried on what its header says
        if status in _TRANSIENT_STATUS:
            seconds = float(retry_after) if retry_after and retry_after.isdigit() else None
            raise RetryableError(f'{self._url} answered HTTP {status}: {text[:300]}', seconds)
        if status == 404:
            raise BadServerFlow(
                f'{self._url} does not exist: is {self._address} a Jina HTTP gateway in '
                'docarray-v1 mode (what clipserve serves)?'
            )
        if not isinstance(answer, dict):
            raise BadServerFlow(f'{self._url} answered HTTP {status}: {text[:500]}')
        return _to_request(answer)


def _to_request(answer: dict) -> DataRequest:
    data = answer.pop('data', None) or []
    response = DataRequest(answer)
    docs = DocumentArray.from_dict(data)
    for doc in docs:
        # JSON has no dtype: the server's float32 embeddings arrive as float64
        if doc.embedding is not None and getattr(doc.embedding, 'dtype', None) == np.float64:
            doc.embedding = doc.embedding.astype(np.float32)
    response.data.docs = docs
    return response
