"""Documents to embeddings: which documents are texts and which images, the image loaders under the
URI policy, the pipeline run, embeddings written back in place and one error naming every bad document.

DocArray in, DocArray out; no Jina (the executors call this with the documents of a request).
"""

from __future__ import annotations

from dataclasses import dataclass

from docarray import DocumentArray

from clipserve.backends.base import Backend
from clipserve.documents import drop_image_content, image_loader, split_texts_images
from clipserve.endpoints import TOKEN_COUNT_TAG
from clipserve.errors import InvalidDocumentError
from clipserve.metrics import Metrics
from clipserve.models.preprocess import PreprocessConfig
from clipserve.pipeline import EncodePipeline, StageTimes
from clipserve.uris import UriPolicy


@dataclass
class DocumentEncoder:
    """Encodes documents with one replica's backend and pipeline."""

    backend: Backend
    pipeline: EncodePipeline
    uri_policy: UriPolicy
    preprocess_config: PreprocessConfig
    metrics: Metrics

    def encode(
        self, docs: DocumentArray, drop_images: bool, skip: set[int] | None = None, count_tokens: bool = False
    ) -> None:
        """Embed every text and image document in place; raise InvalidDocumentError naming the bad ones.

        `skip` holds ids (Python `id()`) of documents that keep the embedding they already have.
        Images that fail to load are named in the error; the others are still embedded.
        `count_tokens` writes each text's token count into its tags (TOKEN_COUNT_TAG).
        """
        skip = skip or set()
        texts, images = split_texts_images(d for d in docs if id(d) not in skip)
        failures = []
        model = self.backend.model_name
        if images:
            times = StageTimes()
            loaders = [image_loader(d, self.uri_policy, self.preprocess_config) for d in images]
            result = self.pipeline.encode_images(loaders, times)
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
            embeddings = self.pipeline.encode_texts([d.text for d in texts], times, counts)
            self.metrics.stage_times(model, 'text', times.preprocess, times.inference)
            for doc, row in zip(texts, embeddings):
                doc.embedding = row
                doc.mime_type = 'text'
            for doc, count in zip(texts, counts or ()):
                doc.tags[TOKEN_COUNT_TAG] = count
        if failures:
            raise InvalidDocumentError(failures)
