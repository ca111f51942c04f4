"""/rank on documents, clip-as-service's semantics: which documents need an embedding, what makes a
request unrankable, and the scores written back; the math itself is `ranking.py`.

Each root document is a query whose `matches` are scored by softmax(100 x cosine) over that query's
own matches (`clip_score`) and by cosine (`clip_score_cosine`), then sorted by score, descending.
"""

from __future__ import annotations

import numpy as np
from docarray import Document, DocumentArray
from docarray.score import NamedScore

from clipserve import ranking
from clipserve.documents import has_image
from clipserve.encoding import DocumentEncoder
from clipserve.errors import InvalidDocumentError
from clipserve.options import check_bool, request_options


def rank_documents(
    encoder: DocumentEncoder, docs: DocumentArray, parameters: dict, reuse_embeddings_default: bool, logger
) -> None:
    """/rank: encode what needs it, refuse what cannot be ranked (naming each document), score and sort.

    `reuse_embeddings` (request parameter, else `reuse_embeddings_default`) keeps the embeddings
    documents already carry; a query without matches fails unless `allow_empty_matches` is set.
    """
    options = request_options(parameters, '@r', logger)
    reuse = check_bool('reuse_embeddings', parameters.get('reuse_embeddings', reuse_embeddings_default))
    everyone = [d for d, _ in members(docs)]
    reused = {id(d) for d in everyone if reuse and d.embedding is not None}
    found = problems(docs, reused, encoder.backend.embed_dim, options.allow_empty_matches)
    if found:
        raise InvalidDocumentError(found)
    encoder.encode(DocumentArray(everyone), options.drop_image_content, reused, options.token_counts)
    sigmoid = encoder.backend.sigmoid_logits  # (scale, bias) of SigLIP models, else None
    for query in docs:
        score_and_sort(query, sigmoid)


def members(queries: DocumentArray) -> list[tuple[Document, str]]:
    """Every query and match, with its role ('query' / 'match'), queries first within each group."""
    return [(d, role) for q in queries for d, role in [(q, 'query'), *((m, 'match') for m in q.matches)]]


def problems(queries: DocumentArray, reused: set[int], embed_dim: int, allow_empty_matches: bool) -> list[tuple]:
    """(document id, reason) for everything that makes the request unrankable; `reused`: ids (Python
    `id()`) of documents whose own embedding is kept."""
    found = []
    for query in queries:
        if not len(query.matches) and not allow_empty_matches:
            found.append((query.id, 'has no matches to rank (send allow_empty_matches=true to pass it through)'))
    for doc, role in members(queries):
        if id(doc) in reused:
            dim = np.asarray(doc.embedding).size
            if dim != embed_dim:
                found.append((doc.id, f'{role} embedding has dimension {dim}, the model gives {embed_dim}'))
        elif not doc.text and not has_image(doc):
            found.append((doc.id, f'{role} has no text, image or embedding to rank with'))
    return found


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
