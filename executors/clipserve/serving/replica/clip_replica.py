"""The replica every CLIP executor is, whatever the DocArray flavour: model, backend, engine, limits, metrics.

A replica is built from its settings (config/settings.py): backend, pipeline, document encoder and
metrics; it binds its endpoints (routing.py for multi-model Flows), answers /clipserve/info, counts
requests in flight (admission, metrics) and drains on shutdown. Nothing here knows a document type:
executors.py puts DocArray v1's endpoints on it (clip-as-service's executors, for clip-client), and
executors_v2.py DocArray v2's (typed documents, jina/schemas.py); both share all of this.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.torch.lean_imports import keep_triton_out
from clipserve.config.parameters import MULTI_VECTOR_PARAMETER
from clipserve.config.settings import executor_settings
from clipserve.engine.fetch import FetchBudget
from clipserve.engine.pipeline import EncodePipeline
from clipserve.errors import InvalidParameterError
from clipserve.inputs.uris import UriPolicy
from clipserve.models.names import parse_model_name
from clipserve.serving.jina.api import JINA_ARGUMENTS, requests
from clipserve.serving.jina.compat import install_grpc_server_defaults
from clipserve.serving.jina.endpoints import INFO_ENDPOINT
from clipserve.serving.replica.admitted import AdmittedExecutor
from clipserve.serving.replica.encoding import DocumentEncoder
from clipserve.serving.replica.routing import model_routes

# ---- The replica both executors are ---------------------------------------------------------------

install_grpc_server_defaults()  # before Jina builds this replica's gRPC server (jina/compat.py)


def thread_budget(copies: int, cores: int | None = None) -> int | None:
    """CPU threads per copy of an executor so that copies x threads never exceeds the cores; OMP_NUM_THREADS wins."""
    if os.environ.get('OMP_NUM_THREADS'):
        return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)
    return max(1, cores // max(1, copies))


class CLIPReplica(AdmittedExecutor):
    """Loads one CLIP model on one backend; its subclasses encode and rank documents of one DocArray flavour with it.

    Every argument but Jina's own is a setting of config/settings.py (EXECUTOR_SETTINGS: type, default,
    environment variable), read by its one loader; a name the table lacks is an error naming it.
    """

    #: /rank keeps the embeddings documents already carry (the request parameter `reuse_embeddings` wins)
    reuse_embeddings_default = False

    def __init__(self, **kwargs):
        super().__init__(**{k: kwargs.pop(k) for k in JINA_ARGUMENTS if k in kwargs})
        started = time.perf_counter()
        self.settings = settings = executor_settings(**kwargs)  # the rest are settings; an unknown name is an error
        for warning in settings.warnings:
            self.logger.warning(warning)
        try:
            self.model = parse_model_name(settings.name)
        except ValueError as e:
            raise InvalidParameterError(f'name: {e}') from None
        self._configured_name = settings.name
        self.minibatch_size = settings.minibatch_size
        self.access_paths = settings.access_paths
        self.serve_default = settings.serve_default
        self.shutdown_grace = settings.shutdown_grace
        self.uri_policy = UriPolicy(
            allow_local_files=settings.allow_local_files,
            local_files_root=settings.local_files_root,
            allow_remote=settings.allow_remote_uris,
            allowed_hosts=settings.remote_allowed_hosts,
            remote_timeout=settings.remote_timeout,
            max_bytes=settings.max_image_bytes,
        )
        copies = (getattr(self.runtime_args, 'replicas', 1) or 1) * (getattr(self.runtime_args, 'shards', 1) or 1)
        self.threads = settings.threads or thread_budget(copies)
        self.backend = self._load_backend(settings)
        self.preprocess_config = dataclasses.replace(
            self.backend.preprocess, max_pixels=settings.max_image_pixels, jpeg_draft=settings.jpeg_draft
        )
        self.model_label = self.backend.model_name
        self.metrics = self.make_metrics()
        self.admit_requests(settings)
        self.pipeline = self._pipeline(settings)
        self.encoder = DocumentEncoder(
            self.backend, self.pipeline, self.uri_policy, self.preprocess_config, self.metrics
        )
        self.served_models = list(settings.served_models) or [self.backend.model_name]
        self.load_seconds = time.perf_counter() - started
        self.warmup_seconds = self._warm_up()
        self._log_ready(settings, copies)

    def _load_backend(self, settings):
        if settings.backend == 'torch':
            keep_triton_out(settings.device)
        options = BackendOptions(
            device=settings.device,
            dtype=settings.dtype,
            num_threads=self.threads,
            trust_remote_code=settings.trust_remote_code,
            truncate_dim=settings.truncate_dim,
        )
        return create_backend(
            settings.backend, self.model, options, model_path=settings.model_path, max_batch=settings.minibatch_size
        )

    def _pipeline(self, settings) -> EncodePipeline:
        """The engine's batching pipeline, its waits and load reported to this replica's metrics."""
        pipeline = EncodePipeline(
            self.backend,
            settings.minibatch_size,
            settings.num_worker_preprocess,
            batch_wait=settings.batch_wait_ms / 1000 if settings.batch_requests else None,
            others_in_flight=lambda: self.admission.requests > 1,
            fetch_threads=settings.fetch_threads,
            fetch_budget=FetchBudget(settings.fetch_seconds, settings.fetch_max_bytes, settings.fetch_concurrency),
            on_wait=lambda kind, seconds: self.metrics.queue_wait(self.backend.model_name, kind, seconds),
            on_pass=lambda kind, rows, seconds: self.metrics.forward_pass(self.backend.model_name, kind, rows, seconds),
        )
        self.metrics.watch_load(
            self.backend.model_name,
            lambda: self.admission.requests,
            lambda: self.admission.documents,
            pipeline.scheduler.waiting_rows,
        )
        return pipeline

    def _log_ready(self, settings, copies: int) -> None:
        self.logger.info(
            f'ready in {self.load_seconds + self.warmup_seconds:.1f}s (load {self.load_seconds:.1f}s, '
            f'warm-up {self.warmup_seconds:.2f}s): {self.backend.describe()}; precision {self.backend.precision.reason}; '
            f'threads {self.threads or "OMP_NUM_THREADS"} ({copies} copies of this executor on {os.cpu_count()} cores); '
            f'limits: {settings.max_requests} requests (and {settings.small_request_reserve} small ones), '
            f'{settings.max_documents} documents in flight; then a queue of {settings.max_queued_requests} requests'
        )

    def _warm_up(self) -> float:
        """One text and one image through the whole path (preprocessing, model), then counters reset."""
        started = time.perf_counter()
        self.encode_documents(self.warm_up_documents(), drop_images=True)
        b = self.backend
        b.model_calls = b.images_encoded = b.texts_encoded = 0
        return time.perf_counter() - started

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
            MULTI_VECTOR_PARAMETER: b.output.late_interaction,  # [tokens, dim] per document (late_interaction.py)
            'image_size': b.image_size,
            'trims_padding': b.trims_padding,
            'model_calls': b.model_calls,
            'images_encoded': b.images_encoded,
            'texts_encoded': b.texts_encoded,
            'torch_imported': 'torch' in sys.modules,
            'triton_imported': sys.modules.get('triton') is not None,
            'pid': os.getpid(),
            'batch_requests': self.pipeline.batches_requests,
            # forward passes by kind since start (warm-up's included): rows merged per pass, the model's busy time
            'passes': {kind: counts.as_dict() for kind, counts in self.pipeline.scheduler.passes.items()},
            'requests_in_flight': self.admission.requests,
            'documents_in_flight': self.admission.documents,
            'requests_queued': self.admission.queued,
            'refused': self.admission.refused,
            'threads': self.threads,
            'limits': {
                'max_requests': self.settings.max_requests,
                'max_documents': self.settings.max_documents,
                'small_request_reserve': self.settings.small_request_reserve,
                'max_queued_requests': self.settings.max_queued_requests,
                'max_queued_documents': self.settings.max_queued_documents,
                'max_queued_bytes': self.settings.max_queued_bytes,
            },
            'load_seconds': round(self.load_seconds, 3),
            'warmup_seconds': round(self.warmup_seconds, 3),
            'draining': self._draining,
        }

    def shard_state(self) -> tuple[int, int, bool, dict]:
        """(shard id, shards, draining, admission): what a readiness probe needs. This copy has loaded and
        warmed up (it answers), whether it is draining, which shard it is, and its bound on requests (the
        gateway mirrors it: gateway/replica_room.py); each flavour answers READY_ENDPOINT with one document per
        shard, so a head polling ALL shards merges them (Jina keys returned parameters by executor name,
        which the shards share)."""
        admission = self.admission_summary(self.settings)
        return (
            int(getattr(self.runtime_args, 'shard_id', 0) or 0),
            int(getattr(self.runtime_args, 'shards', 1) or 1),
            self._draining,
            admission,
        )

    # ---- what each DocArray flavour's executors define (executors.py: v1, executors_v2.py: v2) ---------

    def warm_up_documents(self):
        """One text and one image of this flavour, encoded once at start."""
        raise NotImplementedError

    def encode_documents(self, docs, drop_images: bool, skip=None, count_tokens=False, deadline=None) -> None:
        """Embed `docs` (this flavour's) in place (encoding.DocumentEncoder)."""
        raise NotImplementedError
