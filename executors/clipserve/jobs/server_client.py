"""`embed --server URL`: the bulk job embeds through a running clipserve Flow with the light client
(clipserve_client, over its HTTP port's POST /v1/embeddings) instead of loading a second copy of the model.

The light client does the work: a bad image or text costs only its own row (the server names each refused
item by position, and the rest of the batch is sent again), 429 and 5xx answers and dropped connections are
retried with jittered backoff after the server's Retry-After. This module only turns its answers into the
job's rows and its failures into one ServerError that stops the run (finished shards stay finished).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RETRIES = 5  # attempts after the first, for each request of the run (the probe tries twice: a wrong address fails fast)


class ServerError(RuntimeError):
    """The server cannot be used (unreachable, wrong URL, refused the token): the run stops, saying why."""


@dataclass(frozen=True)
class ServedModel:
    model: str
    embed_dim: int


def _light_client():
    try:
        import clipserve_client
    except ImportError:
        raise ServerError(
            '--server embeds through the light client, which is not installed: pip install ./client '
            '(the clipserve-client distribution in this repository)'
        ) from None
    return clipserve_client


class EmbeddingsClient:
    def __init__(
        self, url: str, token: str | None = None, model: str | None = None, timeout: float = 120.0, batch_size: int = 32
    ):
        self.lib = _light_client()
        self.url = url.rstrip('/')
        options = dict(token=token, model=model, timeout=timeout, batch_size=batch_size, fetch_urls=False)
        try:
            self.client = self.lib.Client(self.url, retries=RETRIES, **options)
            self.prober = self.lib.Client(self.url, retries=1, **options)
        except ValueError as e:
            raise ServerError(f'--server takes the HTTP address of a clipserve Flow (http://host:port): {e}') from None
        self.model = model

    def close(self) -> None:
        self.client.close()
        self.prober.close()

    def probe(self) -> ServedModel:
        """The model that will answer (the one named, else the Flow's default) and its embedding size."""
        models = self._call(self.prober.models)
        if self.model:
            chosen = next((m for m in models if self.model in (m.id, *m.aliases)), None)
        else:
            chosen = next((m for m in models if m.default), models[0] if models else None)
        if chosen is None:
            served = ', '.join(m.id for m in models)
            raise ServerError(f'{self.url} does not serve the model {self.model!r}; it serves: {served or "none"}')
        self.model = chosen.id
        return ServedModel(chosen.id, chosen.embedding_dimensions)

    def embed_images(self, images: list[bytes], dim: int) -> tuple[np.ndarray, dict[int, str]]:
        return self._embed(list(images), dim)

    def embed_texts(self, texts: list[str], dim: int) -> tuple[np.ndarray, dict[int, str]]:
        return self._embed([{'text': text} for text in texts], dim)

    def _embed(self, inputs: list, dim: int) -> tuple[np.ndarray, dict[int, str]]:
        """Vectors of the inputs that worked, in order, and {input index: reason} for the others."""
        if not inputs:
            return np.zeros((0, dim), np.float32), {}
        result = self._call(self.client.encode_partial, inputs, model=self.model)
        vectors = result.vectors if result.indices else np.zeros((0, dim), np.float32)
        failed = {i: reason.removeprefix(f'input {i}: ') for i, reason in result.failed.items()}
        return vectors, failed

    def _call(self, call, *args, **kwargs):
        """The light client's call; what stops the run becomes a ServerError saying why."""
        lib = self.lib
        try:
            return call(*args, **kwargs)
        except lib.AuthenticationError:
            raise ServerError(
                f'{self.url} refused the token (HTTP 401): pass it with --token or CLIPSERVE_AUTH_TOKEN'
            ) from None
        except lib.NotFoundError as e:
            raise ServerError(f'{self.url}: {e.message} (is it the HTTP port of a clipserve Flow?)') from None
        except (lib.APIStatusError, lib.UnexpectedAnswerError, ConnectionError, TimeoutError) as e:
            raise ServerError(str(e)) from None
