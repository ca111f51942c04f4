"""clipserve's own Prometheus metrics, registered in the executor's registry when monitoring is on.

Jina already reports request counts and latencies per endpoint; these add what only clipserve
knows: time spent preprocessing vs in the model, documents per request, and errors by cause.
Without a registry (monitoring off) every method is a no-op.
"""

from __future__ import annotations

from clipserve.errors import InvalidDocumentError, InvalidParameterError, UnknownModelError


def error_cause(error: BaseException) -> str:
    if isinstance(error, InvalidDocumentError):
        return 'invalid_document'
    if isinstance(error, InvalidParameterError):
        return 'invalid_parameter'
    if isinstance(error, UnknownModelError):
        return 'unknown_model'
    return 'internal'


class Metrics:
    def __init__(self, registry=None, runtime_name: str = ''):
        self.enabled = registry is not None
        if not self.enabled:
            return
        from prometheus_client import Counter, Histogram, Summary

        labels = ('runtime_name', 'model')
        self._preprocess = Summary(
            'clipserve_preprocess_seconds',
            'Seconds spent decoding, preprocessing and tokenizing',
            labels + ('modality',),
            registry=registry,
        )
        self._inference = Summary(
            'clipserve_inference_seconds', 'Seconds spent in the model', labels + ('modality',), registry=registry
        )
        self._docs = Histogram(
            'clipserve_docs_per_request',
            'Documents encoded per request',
            labels + ('endpoint',),
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096),
            registry=registry,
        )
        self._errors = Counter('clipserve_errors', 'Failed requests by cause', labels + ('cause',), registry=registry)
        self._runtime = runtime_name

    def stage_times(self, model: str, modality: str, preprocess: float, inference: float) -> None:
        if self.enabled:
            self._preprocess.labels(self._runtime, model, modality).observe(preprocess)
            self._inference.labels(self._runtime, model, modality).observe(inference)

    def docs(self, model: str, endpoint: str, count: int) -> None:
        if self.enabled:
            self._docs.labels(self._runtime, model, endpoint).observe(count)

    def error(self, model: str, error: BaseException) -> None:
        if self.enabled:
            self._errors.labels(self._runtime, model, error_cause(error)).inc()
