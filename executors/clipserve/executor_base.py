"""What CLIPEncoder and CLIPRanker share: the Jina adapter over the serving modules.

It builds a replica from its settings (settings.py: backend, pipeline, document encoder, metrics),
binds the endpoints (routing.py for multi-model Flows; encoding.py and rank.py do the work), answers
/clipserve/info and /clipserve/ready, counts requests in flight and drains on shutdown (lifecycle.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

from docarray import DocumentArray
from jina import Executor, requests

from clipserve import rank
from clipserve.backends import BackendOptions, create_backend
from clipserve.encoding import DocumentEncoder
from clipserve.endpoints import INFO_ENDPOINT, READY_ENDPOINT, ready_report
from clipserve.lean_imports import keep_triton_out
from clipserve.lifecycle import install_drain_when_served, warm_up_documents
from clipserve.metrics import Metrics
from clipserve.models.names import DEFAULT_MODEL
from clipserve.pipeline import EncodePipeline
from clipserve.routing import model_routes
from clipserve.settings import executor_settings


def thread_budget(replicas: int) -> int | None:
    """CPU threads per replica so that replicas x threads never exceeds the cores; OMP_NUM_THREADS wins."""
    if os.environ.get('OMP_NUM_THREADS'):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    return max(1, cores // max(1, replicas))


class CLIPExecutorBase(Executor):
    """Loads one CLIP model on one backend and encodes/ranks DocArray documents with it."""

    #: /rank keeps the embeddings documents already carry (the request parameter `reuse_embeddings` wins)
    reuse_embeddings_default = False

    def __init__(
        self,
        name: str = DEFAULT_MODEL,
        backend: str = 'torch',
        device: str | None = None,
        dtype: str | None = None,
        minibatch_size: int = 32,
        num_worker_preprocess: int = 4,
        access_paths: str = '@r',
        allow_local_files: bool = False,
        local_files_root: str | None = None,
        allow_remote_uris: bool = False,
        remote_allowed_hosts: list | None = None,
        remote_timeout: float = 10.0,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 50_000_000,
        jpeg_draft: bool = False,
        model_path: str | None = None,
        serve_default: bool = True,
        served_models: list | None = None,
        batch_requests: bool | None = None,
        batch_wait_ms: float = 5.0,
        traversal_paths: str | None = None,
        shutdown_grace: float | None = None,
        trust_remote_code: bool = False,
        truncate_dim: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        started = time.perf_counter()
        settings = executor_settings(
            name=name,
            backend=backend,
            device=device,
            dtype=dtype,
            minibatch_size=minibatch_size,
            num_worker_preprocess=num_worker_preprocess,
            access_paths=access_paths,
            allow_local_files=allow_local_files,
            local_files_root=local_files_root,
            allow_remote_uris=allow_remote_uris,
            remote_allowed_hosts=remote_allowed_hosts,
            remote_timeout=remote_timeout,
            max_image_bytes=max_image_bytes,
            max_image_pixels=max_image_pixels,
            jpeg_draft=jpeg_draft,
            model_path=model_path,
            serve_default=serve_default,
            served_models=served_models,
            batch_requests=batch_requests,
            batch_wait_ms=batch_wait_ms,
            traversal_paths=traversal_paths,
            shutdown_grace=shutdown_grace,
            trust_remote_code=trust_remote_code,
            truncate_dim=truncate_dim,
        )
        for warning in settings.warnings:
            self.logger.warning(warning)
        self.settings = settings
        self._configured_name = settings.name
        self.minibatch_size = settings.minibatch_size
        self.num_worker_preprocess = settings.num_worker_preprocess
        self.access_paths = settings.access_paths
        self.uri_policy = settings.uri_policy
        self.serve_default = settings.serve_default
        self.shutdown_grace = settings.shutdown_grace
        replicas = getattr(self.runtime_args, 'replicas', 1) or 1
        if settings.backend == 'torch':
            keep_triton_out(settings.device)
        self.backend = create_backend(
            settings.backend,
            settings.model,
            BackendOptions(
                device=settings.device,
                dtype=settings.dtype,
                num_threads=thread_budget(replicas),
                trust_remote_code=settings.trust_remote_code,
                truncate_dim=settings.truncate_dim,
            ),
            model_path=settings.model_path,
            max_batch=settings.minibatch_size,
        )
        self.preprocess_config = dataclasses.replace(
            self.backend.preprocess, max_pixels=settings.max_image_pixels, jpeg_draft=settings.jpeg_draft
        )
        concurrent = bool(getattr(self.runtime_args, 'allow_concurrent', False))
        # (not called `dynamic_batching`: Jina passes its own argument of that name to every executor)
        batching = concurrent if settings.batch_requests is None else settings.batch_requests
        if batching and not concurrent:
            self.logger.warning(
                'batch_requests needs `allow_concurrent: true` on the executor to see concurrent requests'
            )
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self.pipeline = EncodePipeline(
            self.backend,
            settings.minibatch_size,
            settings.num_worker_preprocess,
            batch_wait=settings.batch_wait_seconds if batching else None,
            others_in_flight=lambda: self._in_flight > 1,
        )
        self.metrics = Metrics(
            getattr(self.runtime_args, 'metrics_registry', None), getattr(self.runtime_args, 'name', '')
        )
        self.encoder = DocumentEncoder(
            self.backend, self.pipeline, self.uri_policy, self.preprocess_config, self.metrics
        )
        self.served_models = list(settings.served_models) or [self.backend.model_name]
        self.load_seconds = time.perf_counter() - started
        self.warmup_seconds = self._warm_up()
        self._draining = False
        if getattr(self.runtime_args, 'name', None):  # served by a Jina worker (not built directly)
            install_drain_when_served(self, self.shutdown_grace, self._start_draining, self.logger)
        self.logger.info(
            f'ready in {self.load_seconds + self.warmup_seconds:.1f}s (load {self.load_seconds:.1f}s, '
            f'warm-up {self.warmup_seconds:.2f}s): {self.backend.describe()}; precision {self.backend.precision.reason}'
        )

    def _warm_up(self) -> float:
        """One text and one image through the whole path (preprocessing, model), then counters reset."""
        started = time.perf_counter()
        self.encode_documents(warm_up_documents(self.backend.image_size), drop_images=True)
        b = self.backend
        b.model_calls = b.images_encoded = b.texts_encoded = 0
        return time.perf_counter() - started

    def _start_draining(self) -> None:
        self._draining = True
        self.logger.info(f'draining: no new requests; {self._in_flight} in flight get up to {self.shutdown_grace:g}s')

    def close(self) -> None:
        self.pipeline.close()
        self.backend.close()
        super().close()

    def _bind_model_endpoints(self, *endpoints: str) -> None:
        """Route `/<endpoint>/<model>` by model, for multi-model Flows (see routing.py)."""
        self._requests = model_routes(
            self.requests,
            endpoints,
            self.backend.model_name,
            self._configured_name,
            self.served_models,
            self.serve_default,
        )

    async def __acall__(self, req_endpoint: str, **kwargs):
        """Track requests in flight (for dynamic batching) and count failures by cause (for metrics).

        The gateway's readiness probes are not counted: they would make encoders wait for company.
        """
        counted = 0 if req_endpoint == READY_ENDPOINT else 1
        with self._in_flight_lock:
            self._in_flight += counted
        try:
            return await super().__acall__(req_endpoint, **kwargs)
        except Exception as error:
            self.metrics.error(self.backend.model_name, error)
            raise
        finally:
            with self._in_flight_lock:
                self._in_flight -= counted

    @requests(on=INFO_ENDPOINT)
    def info(self, **kwargs):
        """What this replica serves, for operators and tests (read with `return_responses=True`)."""
        b = self.backend
        return {
            'model': b.model_name,
            'configured_name': self._configured_name,  # the gateway's /v1/models lists both names
            'serve_default': self.serve_default,  # which model answers /encode without a model name
            'backend': b.name,
            'device': b.device,
            'dtype': b.dtype,
            'precision': b.precision.as_dict(),
            'embed_dim': b.embed_dim,
            'image_size': b.image_size,
            'trims_padding': b.trims_padding,
            'model_calls': b.model_calls,
            'images_encoded': b.images_encoded,
            'texts_encoded': b.texts_encoded,
            'torch_imported': 'torch' in sys.modules,
            'triton_imported': sys.modules.get('triton') is not None,
            'pid': os.getpid(),
            'batch_requests': self.pipeline.batches_requests,
            'requests_in_flight': self._in_flight,
            'load_seconds': round(self.load_seconds, 3),
            'warmup_seconds': round(self.warmup_seconds, 3),
            'draining': self._draining,
        }

    @requests(on=READY_ENDPOINT)
    def ready(self, **kwargs):
        """What a readiness probe needs: this copy has loaded and warmed up (it answers), whether it is
        draining, and which shard it is. One document per shard, so a head polling ALL shards merges
        them (Jina keys returned parameters by executor name, which the shards share)."""
        return ready_report(
            int(getattr(self.runtime_args, 'shard_id', 0) or 0),
            int(getattr(self.runtime_args, 'shards', 1) or 1),
            self._draining,
        )

    # ---- encoding and ranking (encoding.py, rank.py) -------------------------------------------

    def encode_documents(
        self, docs: DocumentArray, drop_images: bool, skip: set[int] | None = None, count_tokens: bool = False
    ) -> None:
        self.encoder.encode(docs, drop_images, skip, count_tokens)

    @requests(on='/rank')
    def rank(self, docs: DocumentArray, parameters: dict | None = None, **kwargs):
        """Score and sort each root document's matches as clip-as-service's /rank does (see rank.py)."""
        self.metrics.docs(self.backend.model_name, 'rank', len(docs) + sum(len(d.matches) for d in docs))
        rank.rank_documents(self.encoder, docs, parameters or {}, self.reuse_embeddings_default, self.logger)
        return docs
