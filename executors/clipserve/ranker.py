"""CLIPRanker: /rank as a separate executor, for Flows where matches come from an indexer.

Unlike CLIPEncoder's /rank it keeps embeddings documents already carry (pass
`reuse_embeddings=false` to re-encode), so re-ranking N stored matches costs one query encode.
"""

from clipserve.executor_base import CLIPExecutorBase


class CLIPRanker(CLIPExecutorBase):
    """Scores each document's matches by CLIP similarity and sorts them, clip-as-service style."""

    reuse_embeddings_default = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/rank')
