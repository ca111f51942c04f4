"""DocArray v1 documents in, embeddings and scores out: the v1 flavour's document glue.

- the encoder itself reads documents by attribute and is the same in both flavours (encoding.py, re-exported
  here): which documents are texts or images, the image loaders under the URI policy, embeddings written back;
- `/rank` with clip-as-service's semantics (`rank_documents`): softmax(100 x cosine) over a query's
  own matches as `clip_score`, the cosine as `clip_score_cosine`, sorted descending; the math is the
  engine's (engine/ranking.py);
- the readiness report as v1 Documents (its wire form is jina/endpoints.py's: the executor writes it, the
  gateway reads it through a head that merges the shards' documents) and the warm-up documents.

The DocArray v2 flavour's equivalents are documents_v2.py's.
"""

from __future__ import annotations

import numpy as np
from docarray import Document, DocumentArray
from docarray.score import NamedScore

from clipserve.config.parameters import check_bool, request_options
from clipserve.engine import ranking
from clipserve.errors import InvalidDocumentError
from clipserve.serving.jina.endpoints import (  # noqa: F401  (re-exported)
    INFO_ENDPOINT,
    READY_ENDPOINT,
    TOKEN_COUNT_TAG,
    read_reports,
    ready_report_fields,
)
from clipserve.serving.replica import multi_vector
from clipserve.serving.replica.encoding import (  # noqa: F401  (re-exported: this module's names before encoding.py)
    DocumentEncoder,
    drop_image_content,
    has_image,
    image_source,
    members,
    problems,
    split_texts_images,
)

# ---- The readiness report and the warm-up ---------------------------------------------------------


def ready_report(shard_id: int, shards: int, draining: bool, admission: dict | None = None) -> DocumentArray:
    """This copy's answer to READY_ENDPOINT. Documents rather than returned parameters: Jina keys those
    by executor name, which the shards share, so a head would keep only one shard's."""
    doc_id, tags = ready_report_fields(shard_id, shards, draining, admission)
    return DocumentArray([Document(id=doc_id, tags=tags)])


def warm_up_documents(image_size: int) -> DocumentArray:
    """One text and one image, run once at start so that the first real request is not the slow one."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
    return DocumentArray([Document(text='a photo of a cat'), Document(tensor=image)])


# ---- /rank ----------------------------------------------------------------------------------------


def rank_documents(
    encoder: DocumentEncoder,
    docs: DocumentArray,
    parameters: dict,
    reuse_embeddings_default: bool,
    logger,
    deadline: float | None = None,
) -> None:
    """/rank: encode what needs it, refuse what cannot be ranked (naming each document), score and sort.

    `reuse_embeddings` (request parameter, else `reuse_embeddings_default`) keeps the embeddings
    documents already carry; a query without matches fails unless `allow_empty_matches` is set.
    """
    if encoder.backend.multi_vector:  # late interaction: MaxSim, not cosine (multi_vector.py)
        multi_vector.rank(encoder, docs, parameters, reuse_embeddings_default, logger, deadline, write_maxsim)
        return
    options = request_options(parameters, '@r', logger)
    reuse = check_bool('reuse_embeddings', parameters.get('reuse_embeddings', reuse_embeddings_default))
    everyone = [d for d, _ in members(docs)]
    reused = {id(d) for d in everyone if reuse and d.embedding is not None}
    found = problems(docs, reused, encoder.backend.embed_dim, options.allow_empty_matches)
    if found:
        raise InvalidDocumentError(found)
    encoder.encode(DocumentArray(everyone), options.drop_image_content, reused, options.token_counts, deadline)
    sigmoid = encoder.backend.sigmoid_logits  # (scale, bias) of SigLIP models, else None
    for query in docs:
        score_and_sort(query, sigmoid)


def score_and_sort(query: Document, sigmoid_logits: tuple[float, float] | None = None) -> None:
    """Write clip_score and clip_score_cosine onto the query's matches and sort them; embeddings dropped.

    With `sigmoid_logits` (a SigLIP model's learned scale and bias) each match also gets `siglip_score`,
    the model's own probability that the pair matches; the order stays clip_score's.
    """
    if not len(query.matches):
        return
    matches = list(query.matches)
    candidates = np.stack([np.asarray(m.embedding, dtype=np.float32).reshape(-1) for m in matches])
    probabilities, cosines = ranking.clip_scores(np.asarray(query.embedding).reshape(-1), candidates)
    sigmoids = ranking.sigmoid_scores(cosines, *sigmoid_logits) if sigmoid_logits else [None] * len(matches)
    for match, p, c, s in zip(matches, probabilities, cosines, sigmoids):
        match.scores['clip_score'] = NamedScore(value=float(p), op_name='softmax')
        match.scores['clip_score_cosine'] = NamedScore(value=float(c), op_name='cosine')
        if s is not None:
            match.scores['siglip_score'] = NamedScore(value=float(s), op_name='sigmoid')
        match.embedding = None
    query.matches = DocumentArray([matches[i] for i in ranking.descending_order(probabilities)])


def write_maxsim(query: Document, matches: list, scores: list[float], order: list[int]) -> None:
    """A multi-vector model's /rank: maxsim_score onto each match, matches sorted by it, their embeddings dropped."""
    for match, score in zip(matches, scores):
        match.scores[multi_vector.MAXSIM_SCORE] = NamedScore(value=score, op_name='maxsim')
        match.embedding = None
    query.matches = DocumentArray([matches[i] for i in order])


# ---- Documents the executors write themselves (the indexer's matches, /status) -------------------


def document(doc_id: str, **fields) -> Document:
    """A v1 Document (for the executors that write documents of their own: the indexer's matches, /status)."""
    return Document(id=doc_id, **fields)


def documents(docs) -> DocumentArray:
    return DocumentArray(docs)


def set_score(doc, name: str, value: float, op_name: str) -> None:
    """`doc.scores[name] = value`. op_name keeps the score on the wire when its value is 0 (an exact match):
    docarray 0.21 drops a score whose protobuf message is empty, and protobuf drops zero values."""
    doc.scores[name] = NamedScore(value=value, op_name=op_name)
