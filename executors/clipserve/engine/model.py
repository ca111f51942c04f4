"""Model: a CLIP model in this process, for embeddings without a server (what FastEmbed is used for).

It is a replica without Jina: the backend is built as a replica builds it (create_backend, the same
precision rules: `auto` is what a Flow would serve on this CPU), and runs under the replica's own
EncodePipeline (texts tokenized, truncated and sorted by length as served; images fetched and decoded by a
pool of threads while the model runs, each image's failure kept apart), so its vectors are the server's.
Ranking is clip-as-service's /rank math (ranking.py). Importing it imports neither Jina nor DocArray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Iterator, Sequence

import numpy as np

from clipserve.backends import BackendOptions, create_backend
from clipserve.engine import ranking
from clipserve.engine.image_inputs import ImageInput, image_source
from clipserve.engine.pipeline import EncodePipeline
from clipserve.errors import InvalidDocumentError, InvalidParameterError, UnknownModelError
from clipserve.inputs.uris import UriPolicy

DEFAULT_BATCH = 32  # rows per forward pass on a GPU, where the caller does not say


class ImagesFailedError(InvalidDocumentError):
    """Some images could not be embedded: the message names each (by its position) and why. Nothing is
    lost: `embeddings` holds every image's row, NaN where it failed; `failures_by_index` maps position -> reason."""

    def __init__(self, failures: dict[int, str], embeddings: np.ndarray):
        super().__init__([(f'images[{i}]', reason) for i, reason in sorted(failures.items())])
        self.failures_by_index, self.embeddings = failures, embeddings


@dataclass(frozen=True)
class Ranked:
    """One candidate of rank(): its position in the candidates, clip-as-service's clip_score (softmax of 100 x
    cosine over this query's candidates) and clip_score_cosine; siglip_score for SigLIP models."""

    index: int
    score: float
    cosine: float
    siglip_score: float | None = None


class Model:
    """A model loaded once in this process: embed_texts, embed_images (and iter_* over large inputs), rank.

    `name` is a model name as the server takes it (`ViT-B-32::openai`, `clipserve models` lists them);
    `backend`, `dtype`, `device` and `model_path` mean what the server's settings of those names mean.
    Images may be file paths (this process reads its caller's files), data: URIs, bytes, PIL images or
    arrays [H, W, 3]; http(s) URLs only with `allow_remote=True`, fetched under the server's URI policy
    (public addresses only, one deadline, a size cap).
    """

    def __init__(
        self,
        name: str,
        *,
        backend: str = 'torch',
        dtype: str = 'auto',
        device: str | None = None,
        model_path: str | None = None,
        batch_size: int | None = None,
        threads: int | None = None,
        decode_workers: int | None = None,
        allow_remote: bool = False,
        max_image_bytes: int = 20 * 1024 * 1024,
    ):
        if batch_size is not None and batch_size < 1:
            raise InvalidParameterError(f'batch_size must be at least 1, got {batch_size}')
        options = BackendOptions(
            device=device, dtype=None if dtype in (None, '', 'auto') else dtype, num_threads=threads
        )
        self.backend = create_backend(backend, name, options, model_path=model_path or None, max_batch=batch_size)
        if self.backend.output.late_interaction:
            self.backend.close()
            raise UnknownModelError(
                f'{name} is a late-interaction model (a [tokens, dim] matrix per input): Model embeds one vector per '
                'input; serve it for /v1/embeddings and /rank with MaxSim (docs/late-interaction.md)'
            )
        if batch_size is None:  # the backend's best on a CPU (texts; images run in chunks of their own there)
            batch_size = self.backend.cpu_text_batch if self.backend.device == 'cpu' else DEFAULT_BATCH
        workers = decode_workers or min(4, os.cpu_count() or 1)
        self.pipeline = EncodePipeline(self.backend, minibatch_size=batch_size, num_workers=workers)
        self.policy = UriPolicy(allow_local_files=True, allow_remote=allow_remote, max_bytes=max_image_bytes)
        self.name, self.embed_dim = name, int(self.backend.embed_dim)
        self.precision = getattr(self.backend, 'dtype', None)

    def __repr__(self) -> str:
        return f'Model({self.backend.describe()})'

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the decoding threads and free the model (a closed Model embeds no more)."""
        self.pipeline.close()
        self.backend.close()

    # ---- texts ------------------------------------------------------------------------------------

    def embed_texts(self, texts: Iterable[str], *, normalize: bool = True) -> np.ndarray:
        """float32 [N, D], one row per text in order (unit length unless normalize=False)."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidParameterError(f'texts[{i}] is a {type(text).__name__}, not a str')
        return _normalized(self.pipeline.encode_texts(texts), normalize)

    def iter_texts(self, texts: Iterable[str], *, chunk: int = 1024, normalize: bool = True) -> Iterator[np.ndarray]:
        """embed_texts over any iterable, `chunk` texts at a time (one array each): a generator for inputs
        that do not fit in memory."""
        for part in _chunks(texts, chunk):
            yield self.embed_texts(part, normalize=normalize)

    # ---- images -----------------------------------------------------------------------------------

    def embed_images(self, images: Iterable[ImageInput], *, normalize: bool = True) -> np.ndarray:
        """float32 [N, D], one row per image in order. Images that fail (unreadable, corrupt, over a limit)
        raise ImagesFailedError naming each, after every other image was embedded (it holds their rows)."""
        sources = [image_source(image, i, self.policy, self.backend.preprocess) for i, image in enumerate(images)]
        result = self.pipeline.encode_images(sources)
        out = np.full((len(sources), self.embed_dim), np.nan, dtype=np.float32)
        if len(result.indices):
            out[np.asarray(result.indices)] = _normalized(result.embeddings, normalize)
        if result.failures:
            raise ImagesFailedError(dict(result.failures), out)
        return out

    def iter_images(
        self, images: Iterable[ImageInput], *, chunk: int = 256, normalize: bool = True
    ) -> Iterator[np.ndarray]:
        """embed_images over any iterable, `chunk` images at a time (one array each)."""
        for part in _chunks(images, chunk):
            yield self.embed_images(part, normalize=normalize)

    # ---- ranking ----------------------------------------------------------------------------------

    def rank(
        self,
        *,
        text: str | None = None,
        image: ImageInput | None = None,
        texts: Sequence[str] | None = None,
        images: Sequence[ImageInput] | None = None,
    ) -> list[Ranked]:
        """Candidates scored against one query and sorted best first, as clip-as-service's /rank does: a text
        query against images (`rank(text=..., images=[...])`), an image against texts, or like against like."""
        if (text is None) == (image is None) or (texts is None) == (images is None):
            raise InvalidParameterError(
                'rank() takes one query (text= or image=) and one candidate list (texts= or images=)'
            )
        query = self.embed_texts([text])[0] if text is not None else self.embed_images([image])[0]
        candidates = self.embed_texts(texts) if texts is not None else self.embed_images(images)
        if not len(candidates):
            return []
        scores, cosines = ranking.clip_scores(query, candidates)
        logits = self.backend.sigmoid_logits
        sigmoids = ranking.sigmoid_scores(cosines, *logits) if logits else [None] * len(cosines)
        ranked = [
            Ranked(i, float(scores[i]), float(cosines[i]), None if sigmoids[i] is None else float(sigmoids[i]))
            for i in range(len(cosines))
        ]
        return [ranked[i] for i in ranking.descending_order(scores)]


def _normalized(rows: np.ndarray, normalize: bool) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    if not normalize or not len(rows):
        return rows
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    if size < 1:
        raise InvalidParameterError(f'chunk must be at least 1, got {size}')
    iterator = iter(items)
    while part := list(islice(iterator, size)):
        yield part
