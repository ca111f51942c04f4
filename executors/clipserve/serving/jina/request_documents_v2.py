"""The documents of the requests the gateway makes itself, DocArray v2 (request_documents.py picks the flavour).

The gateway builds them and reads the answers: scores are fields of each match. The replica's side of the same
documents is replica/documents_v2.py.
"""

from __future__ import annotations

from clipserve.serving.jina.endpoints import MAXSIM_SCORE
from clipserve.serving.jina.schemas import ClipDoc, ClipDocs, ClipMatch, ClipMatches, ClipQueries, ClipQuery

SCORES = ('clip_score', 'clip_score_cosine', 'siglip_score', MAXSIM_SCORE)


def request_document(
    doc_id: str, text: str | None = None, uri: str | None = None, blob: bytes | None = None, matches=None
):
    """One document of a request the gateway makes itself: a text, an image by URL, or an image's bytes."""
    fields = {'text': text} if text is not None else {'url': uri} if uri else {'bytes_': blob}
    if matches is None:
        return ClipDoc(id=doc_id, **fields)
    candidates = [ClipMatch(id=m.id, text=m.text, url=m.url, bytes_=m.bytes_) for m in matches]
    return ClipQuery(id=doc_id, matches=ClipMatches(candidates), **fields)


def search_query(doc_id: str, text=None, uri=None, blob=None, embedding=None) -> ClipQuery:
    """A /search query the gateway makes itself: a text, an image (URL or bytes), or a vector."""
    if embedding is not None:
        return ClipQuery(id=doc_id, embedding=embedding)
    fields = {'text': text} if text is not None else {'url': uri} if uri else {'bytes_': blob}
    return ClipQuery(id=doc_id, **fields)


def search_hits(query) -> list[dict]:
    """A /search answer's matches: id, the indexer's scores by name, text, URL and tags."""
    return [
        {'id': m.id, 'scores': dict(m.scores or {}), 'text': m.text, 'uri': m.url, 'tags': dict(m.tags or {})}
        for m in (query.matches or ())
    ]


def request_documents(docs) -> ClipDocs | ClipQueries:
    docs = list(docs)
    return ClipQueries(docs) if docs and isinstance(docs[0], ClipQuery) else ClipDocs(docs)


def match_scores(match) -> dict[str, float]:
    """A ranked match's scores by name (clip_score, clip_score_cosine, and siglip_score for SigLIP models)."""
    return {name: getattr(match, name) for name in SCORES if getattr(match, name, None) is not None}
