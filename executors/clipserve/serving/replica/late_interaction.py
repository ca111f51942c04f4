"""Late-interaction (multi-vector) models at the executors' doors, the same in both DocArray flavours.

A ColPali / ColQwen2 replica writes each document's `embedding` as a [tokens, dim] float32 array (its padding
rows removed; engine/token_vectors.py) instead of one vector:

- /encode (and every path that encodes): clip-client stacks the embeddings of a request into one
  [documents, dim] array, which [tokens, dim] per document breaks (an error, or a ragged object array); so a
  multi-vector replica answers an encode only when the request says it expects them, with the parameter
  `multi_vector: true` (clipserve-client's Jina client sends it when asked; the gateway's /v1/embeddings
  with `return_multivector`), and otherwise refuses by naming that parameter;
- `pool_factor` (request parameter, else the executor's setting; 1: off) pools each page's vectors
  `factor` to one by hierarchical clustering (engine/token_pooling.py) before they are returned; texts
  (queries) are never pooled, and /rank always scores unpooled pages;
- /rank scores each match by MaxSim against its query, `maxsim_score` (the model's output kind,
  engine/output_kind.py, through rank.py), and sorts by it; documents that bring a stored multi-vector
  embedding keep it (CLIPRanker by default, `reuse_embeddings`), checked to be [tokens, dim] of this model's dim.

The encoders of both flavours (executors.py, documents_v2.py) call the two functions here.
"""

from __future__ import annotations

from clipserve.config.parameters import MULTI_VECTOR_PARAMETER, check_bool, check_int
from clipserve.engine.token_pooling import pool_tokens
from clipserve.errors import InvalidParameterError
from clipserve.serving.replica.encoding import split_texts_images

POOL_FACTOR_PARAMETER = 'pool_factor'


def encode_options(backend, parameters: dict | None, default_pool_factor: int = 1, docs=()) -> int:
    """Check an encode request for a multi-vector replica; the pool factor its pages get (1: none).

    A replica of a single-vector model ignores both parameters (parameters reach every executor of a Flow), and
    so does a request with nothing to encode in `docs` (an indexer's /status, /delete or /clear, which pass
    through the encoder's catch-all endpoint)."""
    parameters = parameters or {}
    texts, images = split_texts_images(docs)
    if not backend.output.late_interaction or not (texts or images):
        return 1
    if not check_bool(MULTI_VECTOR_PARAMETER, parameters.get(MULTI_VECTOR_PARAMETER, False)):
        raise InvalidParameterError(
            f"{backend.model_name} is a late-interaction model: each document's embedding is a [tokens, "
            f'{backend.embed_dim}] array, which clip-client cannot return (it stacks one vector per document). '
            f'Send the parameter {MULTI_VECTOR_PARAMETER}=true to receive them (clipserve-client does), or use '
            '/v1/embeddings with "return_multivector": true'
        )
    return check_int(POOL_FACTOR_PARAMETER, parameters.get(POOL_FACTOR_PARAMETER, default_pool_factor))


def pool_pages(docs, factor: int) -> None:
    """Pool the vectors of every image document of `docs` (already encoded) `factor` to one, in place."""
    if factor <= 1:
        return
    _, images = split_texts_images(docs)
    for doc in images:
        if doc.embedding is not None:
            doc.embedding = pool_tokens(doc.embedding, factor)
