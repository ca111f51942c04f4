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

from clipserve.config.parameters import check_bool, request_options
from clipserve.engine import ranking
from clipserve.errors import InvalidDocumentError, InvalidParameterError
from clipserve.serving.jina.endpoints import ready_report_fields
from clipserve.serving.jina.schemas import (
    ClipDoc,
    ClipDocs,
    ClipMatches,
    ReadyReport,
    ReadyReports,
)
from clipserve.serving.replica import multi_vector
from clipserve.serving.replica.encoding import DocumentEncoder, members, problems

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
    late-interaction model's only when asked, pages pooled by `pool_factor` (multi_vector.py)."""
    options = request_options(parameters, default_paths, logger)
    check_roots(options.access_paths)
    shown = views(docs)
    pool = multi_vector.encode_options(encoder.backend, parameters, pool_factor, shown)
    encoder.encode(shown, options.drop_image_content, None, options.token_counts, deadline=deadline)
    multi_vector.pool_pages(shown, pool)


def rank_queries(encoder: DocumentEncoder, queries, parameters: dict, reuse_default: bool, logger, deadline=None):
    """/rank: the v1 flavour's rules (documents.rank_documents): encode what needs it, refuse what cannot be
    ranked naming each document, then score each query's matches and sort them by clip_score."""
    options = request_options(parameters, ROOTS, logger)
    check_roots(options.access_paths)
    if encoder.backend.multi_vector:  # late interaction: MaxSim, not cosine (multi_vector.py)
        multi_vector.rank(encoder, views(queries), parameters, reuse_default, logger, deadline, write_maxsim)
        return
    reuse = check_bool('reuse_embeddings', parameters.get('reuse_embeddings', reuse_default))
    shown = views(queries)
    everyone = [d for d, _ in members(shown)]
    reused = {id(d) for d in everyone if reuse and d.embedding is not None}
    found = problems(shown, reused, encoder.backend.embed_dim, options.allow_empty_matches)
    if found:
        raise InvalidDocumentError(found)
    encoder.encode(everyone, options.drop_image_content, reused, options.token_counts, deadline)
    for query in queries:
        score_and_sort(query, encoder.backend.sigmoid_logits)


def score_and_sort(query, sigmoid_logits: tuple[float, float] | None = None) -> None:
    """clip_score (softmax of 100 x cosine over the query's matches), clip_score_cosine and, for SigLIP models,
    siglip_score onto each match; matches sorted by clip_score, their embeddings dropped (as in v1)."""
    matches = list(query.matches or ())
    if not matches:
        return
    candidates = np.stack([np.asarray(m.embedding, dtype=np.float32).reshape(-1) for m in matches])
    probabilities, cosines = ranking.clip_scores(np.asarray(query.embedding).reshape(-1), candidates)
    sigmoids = ranking.sigmoid_scores(cosines, *sigmoid_logits) if sigmoid_logits else [None] * len(matches)
    for match, p, c, s in zip(matches, probabilities, cosines, sigmoids):
        match.clip_score = float(p)
        match.clip_score_cosine = float(c)
        match.siglip_score = None if s is None else float(s)
        match.embedding = None
    query.matches = ClipMatches([matches[i] for i in ranking.descending_order(probabilities)])


def write_maxsim(query: DocView, matches: list[DocView], scores: list[float], order: list[int]) -> None:
    """A multi-vector model's /rank: maxsim_score onto each match, matches sorted by it, their embeddings dropped."""
    for match, score in zip(matches, scores):
        match.doc.maxsim_score = score
        match.doc.embedding = None
    query.doc.matches = ClipMatches([matches[i].doc for i in order])


def ready_report(shard_id: int, shards: int, draining: bool, admission: dict | None = None) -> ReadyReports:
    """This copy's answer to READY_ENDPOINT, the wire form of jina/endpoints.py (the probe reads id and tags)."""
    doc_id, tags = ready_report_fields(shard_id, shards, draining, admission)
    return ReadyReports([ReadyReport(id=doc_id, tags=tags)])


def warm_up_documents(image_size: int) -> ClipDocs:
    """One text and one image, run once at start so that the first real request is not the slow one."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
    return ClipDocs([ClipDoc(text='a photo of a cat'), ClipDoc(tensor=image)])
