"""DocArray v2 documents (jina/schemas.py) in, embeddings and scores out: the v2 flavour's document glue.

The encoder and the checks of /rank are the v1 flavour's (encoding.py), which read a document by attribute
as a v1 Document has them (`text`, `tensor`, `blob`, `uri`, `embedding`, `tags`, `matches`); `DocView`
shows a v2 document that way (`bytes_` as `blob`, `url` as `uri`), so the same code decides texts or images,
loads images under the URI policy, names the bad documents and writes embeddings back. What differs is
what v2 documents carry: scores are fields of each match (`ClipMatch.clip_score`, `clip_score_cosine`,
`siglip_score`), and only the request's own documents are encoded (`access_paths` '@r').
"""

from __future__ import annotations

import numpy as np

from clipserve.config.parameters import request_options
from clipserve.engine.output_kind import Ranked
from clipserve.errors import InvalidParameterError
from clipserve.serving.jina.endpoints import ready_report_fields
from clipserve.serving.jina.schemas import (
    ClipDoc,
    ClipDocs,
    ClipMatches,
    ReadyReport,
    ReadyReports,
)
from clipserve.serving.replica import late_interaction
from clipserve.serving.replica.encoding import DocumentEncoder
from clipserve.serving.replica.rank import rank

ROOTS = '@r'


class DocView:
    """A v2 document as the flavour-neutral encoder reads and writes documents (v1 Document attributes)."""

    __slots__ = ('doc', 'matches')

    def __init__(self, doc):
        self.doc = doc
        found = getattr(doc, 'matches', None)
        self.matches = [DocView(m) for m in found] if found is not None else []

    @property
    def id(self) -> str:
        return self.doc.id

    @property
    def text(self) -> str:
        return self.doc.text or ''

    @property
    def tensor(self):
        return self.doc.tensor

    @tensor.setter
    def tensor(self, value) -> None:
        self.doc.tensor = value

    @property
    def blob(self) -> bytes:
        return self.doc.bytes_ or b''

    @blob.setter
    def blob(self, value: bytes) -> None:
        self.doc.bytes_ = value or None

    @property
    def uri(self) -> str:
        return self.doc.url or ''

    @property
    def embedding(self):
        return self.doc.embedding

    @embedding.setter
    def embedding(self, value) -> None:
        self.doc.embedding = value

    @property
    def tags(self) -> dict:
        return self.doc.tags

    @property
    def mime_type(self) -> str:
        return 'text' if self.doc.text else ''

    @mime_type.setter
    def mime_type(self, value: str) -> None:
        """v2 documents have no mime_type: what they are is in their fields."""


def views(docs) -> list[DocView]:
    return [DocView(d) for d in docs]


def check_roots(access_paths: str, where: str = 'access_paths') -> None:
    """The v2 executors encode the request's documents themselves: their types have no chunks to select."""
    if access_paths.replace(' ', '') != ROOTS:
        raise InvalidParameterError(
            f'{where}: the DocArray v2 executors encode the documents of the request ({ROOTS!r}); got '
            f'{access_paths!r} (put what to encode in the request itself, or use the v1 flavour for access paths)'
        )


def encode_request(
    encoder: DocumentEncoder, docs, parameters: dict | None, default_paths: str, logger, deadline, pool_factor=1
):
    """/encode: embed every text and image document of the request in place (documents.DocumentEncoder); a
    late-interaction model's only when asked, pages pooled by `pool_factor` (late_interaction.py)."""
    options = request_options(parameters, default_paths, logger)
    check_roots(options.access_paths)
    shown = views(docs)
    pool = late_interaction.encode_options(encoder.backend, parameters, pool_factor, shown)
    encoder.encode(shown, options.drop_image_content, None, options.token_counts, deadline=deadline)
    late_interaction.pool_pages(shown, pool)


def rank_queries(encoder: DocumentEncoder, queries, parameters: dict, reuse_default: bool, logger, deadline=None):
    """/rank with the v1 flavour's rules (rank.py) over the request's own documents."""
    options = request_options(parameters, ROOTS, logger)
    check_roots(options.access_paths)
    rank(encoder, views(queries), options, parameters, reuse_default, deadline, write_ranked)


def write_ranked(query: DocView, matches: list[DocView], ranked: Ranked) -> None:
    """Each match's score fields (those of the model's output kind; the others stay as they were), the
    matches sorted best first, their embeddings dropped."""
    for match, scores in zip(matches, ranked.scores):
        for name, value in scores.items():
            setattr(match.doc, name, value)
        match.doc.embedding = None
    query.doc.matches = ClipMatches([matches[i].doc for i in ranked.order])


def ready_report(shard_id: int, shards: int, draining: bool, admission: dict | None = None) -> ReadyReports:
    """This copy's answer to READY_ENDPOINT, the wire form of jina/endpoints.py (the probe reads id and tags)."""
    doc_id, tags = ready_report_fields(shard_id, shards, draining, admission)
    return ReadyReports([ReadyReport(id=doc_id, tags=tags)])


def warm_up_documents(image_size: int) -> ClipDocs:
    """One text and one image, run once at start so that the first real request is not the slow one."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
    return ClipDocs([ClipDoc(text='a photo of a cat'), ClipDoc(tensor=image)])
