"""An executor whose requests go through a replica's admission: a bounded queue, deadlines, metrics, a drain.

What every clipserve model replica does at its door, whatever it computes (CLIPReplica: embeddings and CLIP
ranking; CrossEncoderRanker: rerank scores): admit a request at once or after waiting in the queue, or refuse
it as overload (engine/admission.py); give its endpoint the deadline it had at its arrival (`timeout_seconds`,
capped by max_request_seconds); run each admitted request on a thread of its own, concurrently whatever the
Flow says, so requests share forward passes; count refusals and failures; drain on SIGTERM once ready.
The readiness probes and /clipserve/info are neither counted nor refused.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from clipserve.config.parameters import check_number
from clipserve.engine.admission import Admission, Limits, deadline_after
from clipserve.errors import DeadlineExceededError, OverloadedError
from clipserve.serving.jina.api import Executor
from clipserve.serving.jina.compat import allow_concurrent_requests, worker_logger
from clipserve.serving.jina.endpoints import INFO_ENDPOINT, READY_ENDPOINT
from clipserve.serving.replica.error_logs import quiet_client_errors
from clipserve.serving.replica.lifecycle import DrainInstaller
from clipserve.serving.replica.metrics import Metrics


def measure_documents(docs) -> tuple[int, int]:
    """(documents, content bytes) a request holds, for admission: each root and each of its matches (either
    flavour); the bytes are those of its texts, blobs, URIs and tensors (what a queued request keeps in memory)."""
    count = nbytes = 0
    for doc in docs:
        for d in (doc, *(getattr(doc, 'matches', None) or ())):
            count += 1
            nbytes += _content_bytes(d)
    return count, nbytes


def _content_bytes(doc) -> int:
    tensor = getattr(doc, 'tensor', None)
    return (
        len(getattr(doc, 'text', None) or '')
        + len(getattr(doc, 'blob', None) or b'')
        + len(getattr(doc, 'uri', None) or '')
        + int(getattr(tensor, 'nbytes', 0) or 0)
    )


def limits_of(settings) -> Limits:
    """A replica's admission limits from its settings (the limits section of config/settings.py)."""
    return Limits(
        settings.max_requests,
        settings.max_documents,
        small_reserve=settings.small_request_reserve,
        queued_requests=settings.max_queued_requests,
        queued_documents=settings.max_queued_documents,
        queued_bytes=settings.max_queued_bytes,
    )


class AdmittedExecutor(Executor):
    """Call `admit_requests` at the end of the constructor; `model_label` names the model in metrics."""

    model_label = ''

    def admit_requests(self, settings) -> None:
        """Admission, the request threads and the drain from `settings` (max_requests, ..., shutdown_grace)."""
        self.admission = Admission(limits_of(settings))
        self.max_request_seconds = settings.max_request_seconds
        self.shutdown_grace = settings.shutdown_grace
        places = settings.max_requests + settings.small_request_reserve
        self._request_threads = ThreadPoolExecutor(places + 2, thread_name_prefix='clipserve-request')
        self._threads_installed = False
        self._deadlines: dict[int, float] = {}  # id(a request's documents) -> its deadline (see __acall__)
        allow_concurrent_requests(self)
        self._draining = False
        self._drain = None
        if getattr(self.runtime_args, 'name', None):  # served by a Jina worker (not built directly)
            self._drain = DrainInstaller(self, self.shutdown_grace, self._start_draining, self.logger)
            quiet_client_errors(worker_logger(self))  # refusals: one line now and then, no traceback

    def admission_summary(self, settings) -> dict:
        """This replica's bound on requests, as its readiness report carries it to the gateway
        (gateway/replica_room.py mirrors it): the same for every executor behind admission."""
        return {
            'max_requests': settings.max_requests,
            'max_queued_requests': settings.max_queued_requests,
            'small_documents': self.admission.limits.small.documents,
            'retry_after': self.admission.limits.retry_after,
            'executor': type(self).__name__,
        }

    def make_metrics(self) -> Metrics:
        return Metrics(getattr(self.runtime_args, 'metrics_registry', None), getattr(self.runtime_args, 'name', ''))

    def _start_draining(self) -> None:
        self._draining = True
        self.logger.info(
            f'draining: no new requests; {self.admission.requests} in flight get up to {self.shutdown_grace:g}s'
        )

    async def __acall__(self, req_endpoint: str, **kwargs):
        """Admit the request (at once, after waiting in the queue, or refused as overload: engine/admission.py)
        and count failures by kind (for metrics)."""
        if self._drain is not None:
            self._drain.install()  # before the first answer (a no-op once settled): once ready, SIGTERM drains
        if not self._threads_installed:
            # Jina runs each request's endpoint on the event loop's default thread pool (a handful of
            # threads): make it this replica's pool, one thread per request it may hold, so an admitted
            # request never queues behind others (a slow fetch would hold a thread of a small pool)
            asyncio.get_running_loop().set_default_executor(self._request_threads)
            self._threads_installed = True
        if req_endpoint in (READY_ENDPOINT, INFO_ENDPOINT):
            return await super().__acall__(req_endpoint, **kwargs)
        docs = kwargs.get('docs')
        count, nbytes = measure_documents(docs) if docs is not None else (0, 0)
        deadline = self._deadline(kwargs.get('parameters'))
        try:
            place = await self.admission.enter(count, nbytes, deadline)
        except OverloadedError as error:
            self.metrics.refused(self.model_label, error.limit)
            raise
        except DeadlineExceededError as error:
            self.metrics.error(self.model_label, error)
            raise
        self._deadlines[id(docs)] = deadline  # the endpoint's deadline counts from the arrival, not the place
        try:
            return await super().__acall__(req_endpoint, **kwargs)
        except Exception as error:
            self.metrics.error(self.model_label, error)
            raise
        finally:
            self._deadlines.pop(id(docs), None)
            self.admission.leave(place)

    def _deadline(self, parameters: dict | None, docs=None) -> float:
        """The time.monotonic() by which the request must be done: set at its arrival (`docs`, the request's
        documents, names it), else from its `timeout_seconds` and max_request_seconds now."""
        if docs is not None and id(docs) in self._deadlines:
            return self._deadlines[id(docs)]
        timeout = (parameters or {}).get('timeout_seconds')
        if timeout is not None:
            timeout = check_number('timeout_seconds', timeout)
        return deadline_after(timeout, self.max_request_seconds)

    def close(self) -> None:
        self._request_threads.shutdown(wait=False, cancel_futures=True)
        super().close()
