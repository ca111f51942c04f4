"""Documents in, embeddings out, whatever the DocArray flavour: the encoder reads a document's content by
attribute (`text`, `tensor`, `blob`, `uri`) and writes `embedding` (and, on request, a token count into
`tags`), so v1 Documents pass as they are and v2 documents through a view (documents_v2.DocView).

- which documents are texts or images (clip-as-service's rules: non-empty text wins over any image
  content; an image is a tensor, else a blob, else a URI; a document with none is skipped silently);
- `DocumentEncoder`: image loaders under the URI policy, the engine's pipeline run, embeddings written
  back in place, one InvalidDocumentError naming every bad document.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clipserve.backends.base import Backend
from clipserve.engine.image_inputs import capped
from clipserve.engine.pipeline import EncodePipeline, ImageSource, StageTimes
from clipserve.errors import InvalidDocumentError
from clipserve.inputs.uris import UriPolicy
from clipserve.models.preprocess import (
    PreprocessConfig,
    image_from_array,
    preprocess_bytes,
    preprocess_image,
)
from clipserve.serving.jina.endpoints import TOKEN_COUNT_TAG
from clipserve.serving.replica.metrics import Metrics

# ---- Texts or images ------------------------------------------------------------------------------


def has_image(doc) -> bool:
    return doc.tensor is not None or bool(doc.blob) or bool(doc.uri)


def split_texts_images(docs) -> tuple[list, list]:
    """(text docs, image docs); documents with no content are in neither."""
    texts, images = [], []
    for doc in docs:
        if doc.text:
            texts.append(doc)
        elif has_image(doc):
            images.append(doc)
    return texts, images


def image_source(doc, policy: UriPolicy, config: PreprocessConfig) -> ImageSource:
    """How the engine gets the pixels of `doc`'s image: a decoder, and a fetch for a URL or a file.

    The content is captured now (in the request thread) so no worker thread ever touches the
    Document, and the document itself is never mutated by loading. A data: URI is decoded in place:
    it needs no fetch.
    """
    tensor, blob, uri = doc.tensor, doc.blob, doc.uri
    if tensor is not None:  # capped by its shape: max_pixels, checked before any conversion
        return ImageSource(decode=lambda _: preprocess_image(image_from_array(np.asarray(tensor), config), config))
    if blob:
        return ImageSource(decode=lambda _: preprocess_bytes(capped(blob, policy.max_bytes), config))
    if uri.strip().startswith('data:'):
        return ImageSource(decode=lambda _: preprocess_bytes(policy.load(uri), config))
    return ImageSource(decode=lambda data: preprocess_bytes(data, config), fetch=lambda: policy.load(uri))


def drop_image_content(doc) -> None:
    """Remove the image payload (blob/tensor) to save bandwidth; the URI stays."""
    if doc.tensor is not None:
        doc.tensor = None
    if doc.blob:
        doc.blob = b''


# ---- Documents to embeddings ----------------------------------------------------------------------


@dataclass
class DocumentEncoder:
    """Encodes documents with one replica's backend and pipeline."""

    backend: Backend
    pipeline: EncodePipeline
    uri_policy: UriPolicy
    preprocess_config: PreprocessConfig
    metrics: Metrics

    def encode(
        self,
        docs,
        drop_images: bool,
        skip: set[int] | None = None,
        count_tokens: bool = False,
        deadline: float | None = None,
    ) -> None:
        """Embed every text and image document in place; raise InvalidDocumentError naming the bad ones.

        `skip` holds ids (Python `id()`) of documents that keep the embedding they already have.
        Images that fail to load are named in the error; the others are still embedded.
        `count_tokens` writes each text's token count into its tags (TOKEN_COUNT_TAG). Past `deadline`
        (time.monotonic()), what has not run is dropped and DeadlineExceededError raised.
        """
        skip = skip or set()
        request = object()  # this request's rows are scheduled together, fairly against other requests
        texts, images = split_texts_images(d for d in docs if id(d) not in skip)
        failures = []
        model = self.backend.model_name
        if images:
            times = StageTimes()
            sources = [image_source(d, self.uri_policy, self.preprocess_config) for d in images]
            result = self.pipeline.encode_images(sources, times, request=request, deadline=deadline)
            self.metrics.stage_times(model, 'image', times.preprocess, times.inference)
            for row, index in zip(result.embeddings, result.indices):
                images[index].embedding = row
            failures += [(images[i].id, reason) for i, reason in result.failures]
            if drop_images:
                for doc in images:
                    drop_image_content(doc)
        if texts:
            times = StageTimes()
            counts = [] if count_tokens else None
            embeddings = self.pipeline.encode_texts(
                [d.text for d in texts], times, counts, request=request, deadline=deadline
            )
            self.metrics.stage_times(model, 'text', times.preprocess, times.inference)
            for doc, row in zip(texts, embeddings):
                doc.embedding = row
                doc.mime_type = 'text'
            for doc, count in zip(texts, counts or ()):
                doc.tags[TOKEN_COUNT_TAG] = count
        if failures:
            raise InvalidDocumentError(failures)


# ---- /rank: what is ranked, and what cannot be -----------------------------------------------------


def members(queries) -> list[tuple[object, str]]:
    """Every query and match, with its role ('query' / 'match'), queries first within each group."""
    return [(d, role) for q in queries for d, role in [(q, 'query'), *((m, 'match') for m in q.matches)]]


def problems(queries, reused: set[int], embed_dim: int, allow_empty_matches: bool, embedding_problem) -> list:
    """(document id, reason) for everything that makes the request unrankable; `reused`: ids (Python
    `id()`) of documents whose own embedding is kept, checked by `embedding_problem(embedding, embed_dim)`
    (the model's output kind's: one vector of its size, or [tokens, dim])."""
    found = []
    for query in queries:
        if not len(query.matches) and not allow_empty_matches:
            found.append((query.id, 'has no matches to rank (send allow_empty_matches=true to pass it through)'))
    for doc, role in members(queries):
        if id(doc) in reused:
            reason = embedding_problem(doc.embedding, embed_dim)
            if reason is not None:
                found.append((doc.id, f'{role} {reason}'))
        elif not doc.text and not has_image(doc):
            found.append((doc.id, f'{role} has no text, image or embedding to rank with'))
    return found
