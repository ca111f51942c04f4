"""/rank, whatever the DocArray flavour and the model's output kind: encode what needs it, refuse what cannot be
ranked (naming each document), then score each query's matches and hand them to the flavour's writer.

Queries are read as v1 Documents read (`id`, `text`, `embedding`, `matches`; a v2 document through
documents_v2.DocView). The model's output kind (engine/output_kind.py) scores: clip-as-service's softmax of
100 x cosine for one-vector models, MaxSim for late-interaction ones. `write(query, matches, ranked)` puts
the scores onto the matches and sorts them in the flavour's way (documents.py, documents_v2.py).
"""

from __future__ import annotations

from typing import Callable

from clipserve.config.parameters import RequestOptions, check_bool
from clipserve.engine.output_kind import Ranked
from clipserve.errors import InvalidDocumentError
from clipserve.serving.replica.encoding import DocumentEncoder, members, problems


def rank(
    encoder: DocumentEncoder,
    queries,
    options: RequestOptions,
    parameters: dict,
    reuse_default: bool,
    deadline: float | None,
    write: Callable[[object, list, Ranked], None],
) -> None:
    """`reuse_embeddings` (request parameter, else `reuse_default`) keeps the embeddings documents already
    carry, checked to be what this model gives; a query without matches fails unless `allow_empty_matches`."""
    output = encoder.pipeline.output
    reuse = check_bool('reuse_embeddings', parameters.get('reuse_embeddings', reuse_default))
    everyone = [d for d, _ in members(queries)]
    reused = {id(d) for d in everyone if reuse and d.embedding is not None}
    found = problems(queries, reused, encoder.backend.embed_dim, options.allow_empty_matches, output.stored_problem)
    if found:
        raise InvalidDocumentError(found)
    encoder.encode(everyone, options.drop_image_content, reused, options.token_counts, deadline)
    for query in queries:
        matches = list(query.matches)
        if matches:
            ranked = output.rank(query.embedding, [m.embedding for m in matches], encoder.backend.sigmoid_logits)
            write(query, matches, ranked)
