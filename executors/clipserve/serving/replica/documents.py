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

from clipserve.config.parameters import request_options
from clipserve.engine.output_kind import MAXSIM_SCORE, Ranked
from clipserve.serving.jina.endpoints import (  # noqa: F401  (re-exported)
    INFO_ENDPOINT,
    READY_ENDPOINT,
    TOKEN_COUNT_TAG,
    read_reports,
    ready_report_fields,
)
from clipserve.serving.replica.encoding import (  # noqa: F401  (re-exported: this module's names before encoding.py)
    DocumentEncoder,
    drop_image_content,
    has_image,
    image_source,
    members,
    problems,
    split_texts_images,
)
from clipserve.serving.replica.rank import rank

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
    """/rank (rank.py): `reuse_embeddings` (request parameter, else `reuse_embeddings_default`) keeps the
    embeddings documents already carry; a query without matches fails unless `allow_empty_matches` is set."""
    options = request_options(parameters, '@r', logger)
    rank(encoder, docs, options, parameters, reuse_embeddings_default, deadline, write_ranked)


# the op_name each score carries on the wire (clip-as-service's for clip_score and clip_score_cosine)
SCORE_OPS = {'clip_score': 'softmax', 'clip_score_cosine': 'cosine', 'siglip_score': 'sigmoid', MAXSIM_SCORE: 'maxsim'}


def write_ranked(query: Document, matches: list, ranked: Ranked) -> None:
    """The scores onto each match (clip_score, clip_score_cosine and, for SigLIP models, siglip_score; or a
    late-interaction model's maxsim_score), the matches sorted best first, their embeddings dropped."""
    for match, scores in zip(matches, ranked.scores):
        for name, value in scores.items():
            if value is not None:
                match.scores[name] = NamedScore(value=value, op_name=SCORE_OPS[name])
        match.embedding = None
    query.matches = DocumentArray([matches[i] for i in ranked.order])


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
