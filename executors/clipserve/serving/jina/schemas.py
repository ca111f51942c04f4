"""The documents clipserve's DocArray v2 executors take and give: import them in clients to build requests.

    from docarray import DocList
    from clipserve.serving.jina.schemas import ClipDoc, ClipMatch, ClipQuery

    docs = client.post('/encode', DocList[ClipDoc]([ClipDoc(text='a dog'), ClipDoc(url='https://...')]),
                       return_type=DocList[ClipDoc])
    docs[0].embedding                                  # float32 numpy vector (float64 over HTTP: JSON)

A document is a text or an image; a non-empty `text` wins over any image content, and an image is a
`tensor`, else `bytes_`, else `url` (clip-as-service's rules, the v1 flavour's). Field names follow
docarray's own `TextDoc` and `ImageDoc` (`text`, `url`, `bytes_`, `tensor`, `embedding`), so requests made
of those documents are read too. Needs docarray >= 0.40 (pydantic 2) and nothing of Jina or the server.
"""

from typing import Any, Dict, Optional

from docarray import BaseDoc, DocList
from docarray.typing import NdArray
from pydantic import Field


class ClipDoc(BaseDoc):
    """One input of /encode: a text or an image; `embedding` is set on the way back."""

    text: Optional[str] = Field(default=None, description='a text to embed (wins over any image content)')
    url: Optional[str] = Field(
        default=None,
        description='an image: a data: URI, or an http(s) URL or a file the server is allowed to read',
    )
    bytes_: Optional[bytes] = Field(default=None, description='an image: its encoded file (JPEG, PNG, WebP, ...)')
    tensor: Optional[NdArray] = Field(default=None, description='an image: pixels, height x width (x 1, 3 or 4)')
    embedding: Optional[NdArray] = Field(
        default=None,
        description='out: the CLIP embedding (float32, unnormalised); late-interaction models: [tokens, dim]',
    )
    # plain defaults, not default_factory: Jina's HTTP gateway rebuilds these models from their JSON schema,
    # where a field without a default is required
    tags: Dict[str, Any] = Field(
        default={}, description="free-form; the server adds clipserve_tokens (a text's token count) when asked to"
    )


class ClipMatch(ClipDoc):
    """A candidate of a /rank query, with its scores set on the way back (matches come back sorted by them)."""

    clip_score: Optional[float] = Field(
        default=None, description="out: softmax over the query's matches of 100 x cosine"
    )
    clip_score_cosine: Optional[float] = Field(default=None, description='out: cosine similarity to the query')
    siglip_score: Optional[float] = Field(
        default=None, description="out: SigLIP models only: the model's own probability that the pair matches"
    )
    maxsim_score: Optional[float] = Field(
        default=None, description='out: late-interaction models only (ColPali, ColQwen2): MaxSim to the query'
    )
    scores: Dict[str, float] = Field(
        default={},
        description="out: /search: the indexer's score by metric, as clip-as-service's matches carry it (cosine: "
        '1 - cosine similarity; maxsim: larger is closer)',
    )


class ClipQuery(ClipDoc):
    """A /rank query (a text or an image) and the candidates to score against it."""

    matches: Optional[DocList[ClipMatch]] = Field(default=None, description='the candidates; sorted on the way back')


class ReadyReport(BaseDoc):
    """A copy's answer to /clipserve/ready (the gateway's readiness probe reads `tags`)."""

    tags: Dict[str, Any] = Field(default={})


# The lists a request carries, by what they hold (DocList[X] is one class per X; these name them)
ClipDocs = DocList[ClipDoc]
ClipMatches = DocList[ClipMatch]
ClipQueries = DocList[ClipQuery]
ReadyReports = DocList[ReadyReport]

__all__ = ['ClipDoc', 'ClipDocs', 'ClipMatch', 'ClipMatches', 'ClipQueries', 'ClipQuery', 'ReadyReport', 'ReadyReports']
