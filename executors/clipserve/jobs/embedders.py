"""Who turns a chunk of decoded rows into vectors: the model loaded in this process, or a running clipserve
Flow (`--server`). One small interface, so the local engine does not care which.

Both return the embeddings of the items that worked and the reason for each that did not (a server can
refuse one image of a request; a local model cannot, since its inputs were checked while decoding), and
both give unnormalised float32 rows except where the server has already normalised them.
"""

from __future__ import annotations

import numpy as np

from clipserve.jobs.bridge import PreprocessConfig, load_model
from clipserve.jobs.decode import BYTES, PIXELS, Decoded


class ModelEmbedder:
    """The model in this process, loaded as a replica loads it."""

    decode_mode = PIXELS
    normalized = False

    def __init__(self, backend, model, device, dtype, model_path, batch_size, max_pixels=None, threads=None):
        self.model = load_model(backend, model, device, dtype, model_path, batch_size, max_pixels, threads)
        self.preprocess: PreprocessConfig = self.model.preprocess
        self.embed_dim = self.model.embed_dim
        self.description = self.model.description
        self.precision = getattr(self.model.backend, 'dtype', None)

    def encode_images(self, decoded: Decoded) -> tuple[np.ndarray, dict[int, str]]:
        if decoded.pixels is None or not len(decoded.pixels):
            return np.zeros((0, self.embed_dim), np.float32), {}
        return self.model.encode_images(decoded.pixels), {}

    def encode_texts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        if not texts:
            return np.zeros((0, self.embed_dim), np.float32), {}
        return self.model.encode_texts(list(texts)), {}

    def close(self) -> None:
        self.model.close()


class ServerEmbedder:
    """A running clipserve Flow's POST /v1/embeddings: images are sent as data: URIs of their own bytes."""

    decode_mode = BYTES
    normalized = True  # /v1/embeddings answers unit-length vectors

    def __init__(self, url: str, model: str | None, token: str | None, batch_size: int, timeout: float = 120.0):
        from clipserve.jobs.server_client import EmbeddingsClient

        self.client = EmbeddingsClient(url, token=token, model=model, timeout=timeout, batch_size=batch_size)
        self.preprocess = PreprocessConfig()  # only its limits: the server preprocesses for its own model
        info = self.client.probe()
        self.embed_dim = info.embed_dim
        self.description = f'{info.model} served at {url}'
        self.precision = f'served ({info.model})'

    def encode_images(self, decoded: Decoded) -> tuple[np.ndarray, dict[int, str]]:
        return self.client.embed_images(decoded.images or [], self.embed_dim)

    def encode_texts(self, texts: list[str]) -> tuple[np.ndarray, dict[int, str]]:
        return self.client.embed_texts(list(texts), self.embed_dim)

    def close(self) -> None:
        self.client.close()
