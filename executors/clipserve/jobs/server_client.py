"""A light client for a running clipserve Flow's OpenAI-compatible route, POST /v1/embeddings (httpx only:
no Jina, no DocArray, no gRPC), for `embed --server URL`.

Teams that already serve a model embed a collection through it instead of loading a second copy. The
route answers one error for a whole request when an item is bad, naming the items (`input[3]: reason`);
those become row errors and the rest of the request is sent again, so a bad image costs only its own row.
A request too large for the gateway is split in two; 429 and 5xx answers and dropped connections are
retried with backoff, and a server that stays unreachable stops the run (finished shards stay finished).
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass

import numpy as np

_ITEM_ERROR = re.compile(r'input\[(\d+)\](?:\.\w+)?: (.*?)(?=; input\[\d+\]|$)', re.S)
RETRIES = 5


class ServerError(RuntimeError):
    """The server cannot be used (unreachable, wrong URL, refused the token): the run stops, saying why."""


@dataclass(frozen=True)
class ServedModel:
    model: str
    embed_dim: int


def data_uri(data: bytes) -> str:
    """A data: URI for image bytes; the mime type is generic (the server sniffs the format from the bytes)."""
    return 'data:image/*;base64,' + base64.b64encode(data).decode('ascii')


class EmbeddingsClient:
    def __init__(
        self, url: str, token: str | None = None, model: str | None = None, timeout: float = 120.0, batch_size: int = 32
    ):
        import httpx

        self.url = url.rstrip('/')
        if not self.url.startswith(('http://', 'https://')):
            raise ServerError(f'--server takes the HTTP address of a clipserve Flow (http://host:port), got {url!r}')
        headers = {'Authorization': f'Bearer {token}'} if token else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)
        self.model = model
        self.batch_size = batch_size

    def close(self) -> None:
        self.http.close()

    def probe(self) -> ServedModel:
        """The model that will answer (the one named, else the Flow's default) and its embedding size."""
        answer = self._send('GET', '/v1/models', None, tries=2)  # a wrong address fails fast
        models = answer.get('data') or []
        chosen = (
            next((m for m in models if self.model in (m.get('id'), *m.get('aliases', ()))), None)
            if self.model
            else next((m for m in models if m.get('default')), models[0] if models else None)
        )
        if chosen is None:
            served = ', '.join(m.get('id', '?') for m in models)
            raise ServerError(f'{self.url} does not serve the model {self.model!r}; it serves: {served or "none"}')
        self.model = chosen['id']
        return ServedModel(chosen['id'], int(chosen['embedding_dimensions']))

    def embed_images(self, images: list[bytes], dim: int) -> tuple[np.ndarray, dict[int, str]]:
        return self._embed([{'image': data_uri(data)} for data in images], dim)

    def embed_texts(self, texts: list[str], dim: int) -> tuple[np.ndarray, dict[int, str]]:
        return self._embed([{'text': text} for text in texts], dim)

    def _embed(self, items: list[dict], dim: int) -> tuple[np.ndarray, dict[int, str]]:
        """Vectors of the items that worked, in order, and {item index: reason} for the others."""
        vectors: dict[int, np.ndarray] = {}
        failures: dict[int, str] = {}
        pending = [list(range(i, min(i + self.batch_size, len(items)))) for i in range(0, len(items), self.batch_size)]
        while pending:
            indices = pending.pop(0)
            status, answer = self._post([items[i] for i in indices])
            if status == 200:
                for entry in answer['data']:
                    vectors[indices[entry['index']]] = _vector(entry['embedding'])
                continue
            message = (answer.get('error') or {}).get('message', '') if isinstance(answer, dict) else str(answer)
            named = {int(i): reason.strip() for i, reason in _ITEM_ERROR.findall(message) if int(i) < len(indices)}
            if named:
                failures.update({indices[i]: f'the server refused it: {reason}' for i, reason in named.items()})
                rest = [index for k, index in enumerate(indices) if k not in named]
                if rest:
                    pending.insert(0, rest)
            elif status == 413 and len(indices) > 1:
                half = len(indices) // 2
                pending[:0] = [indices[:half], indices[half:]]
            elif status == 413 or status == 400:
                failures.update({i: f'the server refused it: {message}' for i in indices})
            else:
                raise ServerError(f'{self.url}/v1/embeddings answered {status}: {message}')
        order = sorted(vectors)
        matrix = np.stack([vectors[i] for i in order]) if order else np.zeros((0, dim), np.float32)
        return matrix.astype(np.float32), failures

    def _post(self, items: list[dict]):
        body = {'input': items, 'encoding_format': 'base64'}
        if self.model:
            body['model'] = self.model
        return self._send('POST', '/v1/embeddings', body, return_status=True)

    def _send(self, method: str, path: str, body, return_status: bool = False, tries: int = RETRIES):
        import httpx

        delay, last = 0.5, None
        for attempt in range(tries):
            try:
                response = self.http.request(method, self.url + path, json=body)
            except httpx.TransportError as e:
                last = f'{type(e).__name__}: {e}'
            else:
                if response.status_code in (429, 502, 503, 504):
                    last = f'HTTP {response.status_code}'
                elif response.status_code == 401:
                    raise ServerError(
                        f'{self.url} refused the token (HTTP 401): pass it with --token or CLIPSERVE_AUTH_TOKEN'
                    )
                elif response.status_code == 404 and path == '/v1/models':
                    raise ServerError(f'{self.url} has no /v1/models: is it the HTTP port of a clipserve Flow?')
                else:
                    try:
                        answer = response.json()
                    except ValueError:
                        answer = {'error': {'message': response.text[:500]}}
                    if return_status:
                        return response.status_code, answer
                    if response.status_code != 200:
                        raise ServerError(f'{self.url}{path} answered {response.status_code}: {answer}')
                    return answer
            if attempt + 1 < tries:
                time.sleep(delay)
                delay = min(delay * 2, 8.0)
        raise ServerError(f'{self.url}{path}: no answer after {tries} tries ({last})')


def _vector(value) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype='<f4').astype(np.float32)
    return np.asarray(value, dtype=np.float32)
