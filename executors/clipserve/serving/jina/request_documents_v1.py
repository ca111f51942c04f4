"""The documents of the requests the gateway makes itself, DocArray v1 (request_documents.py picks the flavour).

The gateway builds them and reads the answers; the replica's side of the same documents is
replica/documents.py.
"""

from __future__ import annotations

from docarray import Document, DocumentArray


def request_document(
    doc_id: str, text: str | None = None, uri: str | None = None, blob: bytes | None = None, matches=None
):
    """One document of a request the gateway makes itself: a text, an image by URI, or an image's bytes."""
    doc = (
        Document(id=doc_id, text=text)
        if text is not None
        else Document(id=doc_id, uri=uri)
        if uri
        else Document(id=doc_id, blob=blob)
    )
    if matches is not None:
        doc.matches = DocumentArray(matches)
    return doc


def request_documents(docs) -> DocumentArray:
    return DocumentArray(docs)


def search_query(doc_id: str, text=None, uri=None, blob=None, embedding=None) -> Document:
    """A /search query the gateway makes itself: a text, an image (URI or bytes), or a vector (the encoder
    passes a document with nothing but an embedding untouched)."""
    if embedding is not None:
        return Document(id=doc_id, embedding=embedding)
    return request_document(doc_id, text=text, uri=uri, blob=blob)


def search_hits(query) -> list[dict]:
    """A /search answer's matches: id, the indexer's scores by name (0 where the wire dropped a zero), text,
    URI and tags."""
    hits = []
    for match in query.matches:
        scores = {name: score.value or 0.0 for name, score in match.scores.items()}
        hits.append({'id': match.id, 'scores': scores, 'text': match.text, 'uri': match.uri, 'tags': dict(match.tags)})
    return hits


def match_scores(match) -> dict[str, float]:
    """A ranked match's scores by name (clip_score, clip_score_cosine, siglip_score for SigLIP models; maxsim_score
    for late-interaction ones)."""
    return {name: score.value for name, score in match.scores.items()}
