"""CLIPEncoder and CLIPRanker: clip-as-service's executors, endpoint for endpoint, over clipserve's engine.

The DocArray v1 flavour (docarray 0.21, the wire clip-client speaks). The replica itself (settings,
backend, pipeline, admission, metrics, drain, /clipserve/info) is clip_replica.py's and shared with the
DocArray v2 executors of executors_v2.py; this module binds v1 Documents to it (documents.py does the work).

CLIPEncoder: a bare `@requests` makes `encode` the catch-all, so `/`, `/encode`, `/encode/<model>`,
`/index`, `/search` and any other unbound path all encode, exactly as legacy Flows and clip-client
expect; `/rank` (and `/rank/<model>`) scores matches, so single-executor legacy Flows keep working.

CLIPRanker: `/rank` as a separate executor, for Flows where matches come from an indexer. Unlike
CLIPEncoder's /rank it keeps embeddings documents already carry (`reuse_embeddings=false` re-encodes),
so re-ranking N stored matches costs one query encode.

No `from __future__ import annotations` here: Jina reads the endpoints' `docs` annotations as types, and warns
at every start about string ones.
"""

from docarray import DocumentArray

from clipserve.config.parameters import request_options
from clipserve.serving.jina.api import requests
from clipserve.serving.replica import late_interaction
from clipserve.serving.replica.clip_replica import CLIPReplica, thread_budget  # noqa: F401  (thread_budget: re-exported)
from clipserve.serving.replica.documents import READY_ENDPOINT, rank_documents, ready_report, warm_up_documents

# ---- The v1 replica both executors are ---------------------------------------------------------------


class CLIPExecutorBase(CLIPReplica):
    """Loads one CLIP model on one backend and encodes/ranks DocArray v1 documents with it.

    Every argument is a setting of config/settings.py (type, default, environment variable); None means
    "not given": the environment variable, else the default.
    """

    def warm_up_documents(self) -> DocumentArray:
        return warm_up_documents(self.backend.image_size)

    @requests(on=READY_ENDPOINT)
    def ready(self, **kwargs):
        """What a readiness probe needs (replica.shard_state), as one v1 Document per shard."""
        return ready_report(*self.shard_state())

    # ---- encoding and ranking (documents.py) ----------------------------------------------------

    def encode_documents(
        self,
        docs: DocumentArray,
        drop_images: bool,
        skip: set[int] | None = None,
        count_tokens: bool = False,
        deadline: float | None = None,
    ) -> None:
        self.encoder.encode(docs, drop_images, skip, count_tokens, deadline=deadline)

    @requests(on='/rank')
    def rank(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        """Score and sort each root document's matches as clip-as-service's /rank does (see documents.py)."""
        self.metrics.docs(self.backend.model_name, 'rank', len(docs) + sum(len(d.matches) for d in docs))
        deadline = self._deadline(parameters, docs)
        rank_documents(self.encoder, docs, parameters or {}, self.reuse_embeddings_default, self.logger, deadline)
        return docs


# ---- CLIPEncoder ----------------------------------------------------------------------------------


class CLIPEncoder(CLIPExecutorBase):
    """Texts and images to CLIP embeddings (float32, unnormalised), written onto the documents in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/encode', '/rank')

    @requests
    def encode(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        options = request_options(parameters, self.access_paths, self.logger)
        selected = docs[options.access_paths]
        pool = late_interaction.encode_options(self.backend, parameters, self.settings.pool_factor, selected)
        self.metrics.docs(self.backend.model_name, 'encode', len(selected))
        deadline = self._deadline(parameters, docs)
        extra = {'count_tokens': True} if options.token_counts else {}  # subclasses overriding encode_documents
        self.encode_documents(selected, options.drop_image_content, deadline=deadline, **extra)
        late_interaction.pool_pages(selected, pool)
        return docs

    @requests(on='/encode')
    def encode_endpoint(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        """`/encode` bound by name too, so `/encode/<model>` can be, and multi-model Flows can route it."""
        return self.encode(docs, parameters)


# ---- CLIPRanker -----------------------------------------------------------------------------------


class CLIPRanker(CLIPExecutorBase):
    """Scores each document's matches by CLIP similarity and sorts them, clip-as-service style."""

    reuse_embeddings_default = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/rank')
