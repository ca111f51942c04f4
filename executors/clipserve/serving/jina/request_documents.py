"""The documents of the requests the gateway makes itself (the OpenAI-compatible routes, gateway/flow_calls.py), in
the installed DocArray flavour (flavour.py): request_documents_v1.py's for v1, request_documents_v2.py's for v2.

- `request_document(doc_id, text=, uri=, blob=, matches=)`: a text, an image by URI (fetched by the encoder under
  the operator's URI policy) or an image's bytes; with `matches`, a /rank query over those documents;
- `request_documents(docs)`: the list a request carries;
- `match_scores(match)`: a ranked match's scores by name (clip_score, clip_score_cosine, siglip_score);
- `search_query(doc_id, text=, uri=, blob=, embedding=)` and `search_hits(query)`: a /search query and its matches.
Answers are read by attribute, the same in both flavours: `id`, `text`, `embedding`, `tags`, `matches`.
"""

from __future__ import annotations

from clipserve.serving.jina.flavour import installed

if installed() == 'v2':
    from clipserve.serving.jina.request_documents_v2 import (
        match_scores,
        request_document,
        request_documents,
        search_hits,
        search_query,
    )
else:
    from clipserve.serving.jina.request_documents_v1 import (
        match_scores,
        request_document,
        request_documents,
        search_hits,
        search_query,
    )

__all__ = ['match_scores', 'request_document', 'request_documents', 'search_hits', 'search_query']
