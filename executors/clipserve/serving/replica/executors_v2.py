"""CLIPEncoder and CLIPRanker for DocArray v2 (docarray >= 0.40, pydantic 2): typed documents over the same replica.

The same executors as executors.py's (clip-as-service's, for DocArray v1), under the same names, built on
the same replica (clip_replica.py: settings, backend, engine, limits, metrics, drain) and the same encoder; only
the documents differ: `ClipDoc` in and out of /encode, `ClipQuery` (with `ClipMatch` matches) in and out of
/rank (jina/schemas.py, which clients import). `import clipserve` defines these when docarray v2 is installed.

CLIPEncoder: `/encode` (and `/encode/<model>`), the default endpoint (every other path; Jina's HTTP gateway
calls it `/default`), and `/rank`. CLIPRanker: `/rank`, keeping embeddings the matches already carry.
Endpoint annotations are real types, not strings: Jina builds each endpoint's schema from them (so this
module does not use postponed annotations).
"""

from typing import Optional

from clipserve.serving.jina.api import requests
from clipserve.serving.jina.compat import install_pydantic_compat
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT
from clipserve.serving.jina.schemas import ClipDocs, ClipQueries, ReadyReports
from clipserve.serving.replica import documents_v2
from clipserve.serving.replica.clip_replica import CLIPReplica

install_pydantic_compat()  # before Jina builds an HTTP or WebSocket app in this process (jina/compat.py)


class CLIPExecutorBase(CLIPReplica):
    """Loads one CLIP model on one backend and encodes/ranks DocArray v2 documents (jina/schemas.py) with it.

    Every argument is a setting of config/settings.py (type, default, environment variable); None means
    "not given": the environment variable, else the default. `access_paths` can only be '@r' here.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        documents_v2.check_roots(self.access_paths, 'access_paths (executor setting)')

    def warm_up_documents(self) -> ClipDocs:
        return documents_v2.warm_up_documents(self.backend.image_size)

    def encode_documents(self, docs, drop_images: bool, skip=None, count_tokens=False, deadline=None) -> None:
        views = documents_v2.views(docs)
        self.encoder.encode(views, drop_images, skip, count_tokens, deadline=deadline)

    @requests(on=INFO_ENDPOINT)
    def info(self, docs: ClipDocs, **kwargs) -> ClipDocs:  # returns a dict: the docs pass unchanged
        """What this replica serves (clip_replica.py), for operators, tests and the gateway's /v1/models."""
        return CLIPReplica.info(self)

    @requests(on=READY_ENDPOINT)
    def ready(self, docs: ReadyReports, **kwargs) -> ReadyReports:
        """What a readiness probe needs (replica.shard_state), as one document per shard."""
        return documents_v2.ready_report(*self.shard_state())

    @requests(on='/rank')
    def rank(self, docs: ClipQueries, parameters: Optional[dict] = None, **kwargs) -> ClipQueries:
        """Score and sort each query's matches as the v1 flavour's /rank does (documents_v2.rank_queries)."""
        self.metrics.docs(self.backend.model_name, 'rank', len(docs) + sum(len(d.matches or ()) for d in docs))
        deadline = self._deadline(parameters, docs)
        documents_v2.rank_queries(
            self.encoder, docs, parameters or {}, self.reuse_embeddings_default, self.logger, deadline
        )
        return docs


class CLIPEncoder(CLIPExecutorBase):
    """Texts and images to CLIP embeddings (float32, unnormalised), written onto the documents."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/encode', '/rank')

    @requests
    def encode(self, docs: ClipDocs, parameters: Optional[dict] = None, **kwargs) -> ClipDocs:
        self.metrics.docs(self.backend.model_name, 'encode', len(docs))
        deadline = self._deadline(parameters, docs)
        documents_v2.encode_request(
            self.encoder, docs, parameters, self.access_paths, self.logger, deadline, self.settings.pool_factor
        )
        return docs

    @requests(on='/encode')
    def encode_endpoint(self, docs: ClipDocs, parameters: Optional[dict] = None, **kwargs) -> ClipDocs:
        """`/encode` bound by name too, so `/encode/<model>` can be, and multi-model Flows can route it."""
        return self.encode(docs, parameters)


class CLIPRanker(CLIPExecutorBase):
    """Scores each query's matches by CLIP similarity and sorts them, clip-as-service style."""

    reuse_embeddings_default = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bind_model_endpoints('/rank')
