"""clipserve's own Prometheus metrics, registered in the executor's registry when monitoring is on.

Jina already reports request counts and latencies per endpoint; these add what only clipserve
knows: time spent preprocessing vs in the model, documents per request, errors by kind, and the
replica's load: requests and documents it holds, rows waiting for the model, how long rows wait
before they run, and requests refused as overload. Without a registry (monitoring off) every
method is a no-op. The names, their labels and their help texts are listed in METRICS (the docs'
reference is generated from it).
"""

from __future__ import annotations

from typing import Callable

from clipserve.errors import ClipServeError

LABELS = ('runtime_name', 'model')
#: name -> (type, extra labels, help)
METRICS = {
    'clipserve_preprocess_seconds': ('summary', ('modality',), 'Seconds spent decoding, preprocessing and tokenizing'),
    'clipserve_inference_seconds': ('summary', ('modality',), 'Seconds spent waiting for and in the model'),
    'clipserve_docs_per_request': ('histogram', ('endpoint',), 'Documents per request'),
    'clipserve_errors': ('counter', ('cause',), 'Failed requests by kind (the error code)'),
    'clipserve_refused': ('counter', ('limit',), 'Requests refused as overload, by the limit they hit'),
    'clipserve_queue_wait_seconds': (
        'histogram',
        ('modality',),
        'Seconds from a minibatch reaching the model thread to its first rows running',
    ),
    'clipserve_pass_rows': ('histogram', ('modality',), 'Rows in one forward pass (concurrent requests merged)'),
    'clipserve_model_busy_seconds': ('counter', ('modality',), 'Seconds the model thread spent in forward passes'),
    'clipserve_requests_in_flight': ('gauge', (), 'Requests this replica holds'),
    'clipserve_documents_in_flight': ('gauge', (), 'Documents this replica holds'),
    'clipserve_rows_waiting': ('gauge', ('modality',), 'Rows queued for the model, not yet running'),
}
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def error_cause(error: BaseException) -> str:
    return error.code if isinstance(error, ClipServeError) else 'internal_error'


class Metrics:
    def __init__(self, registry=None, runtime_name: str = ''):
        self.enabled = registry is not None
        self._runtime = runtime_name
        if not self.enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram, Summary

        kinds = {'summary': Summary, 'counter': Counter, 'gauge': Gauge, 'histogram': Histogram}
        self._m = {}
        for name, (kind, extra, help_text) in METRICS.items():
            options = {}
            if name in ('clipserve_docs_per_request', 'clipserve_pass_rows'):
                options['buckets'] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
            elif kind == 'histogram':
                options['buckets'] = WAIT_BUCKETS
            self._m[name] = kinds[kind](name, help_text, LABELS + extra, registry=registry, **options)

    def _labels(self, name: str, model: str, *extra):
        return self._m[name].labels(self._runtime, model, *extra)

    def stage_times(self, model: str, modality: str, preprocess: float, inference: float) -> None:
        if self.enabled:
            self._labels('clipserve_preprocess_seconds', model, modality).observe(preprocess)
            self._labels('clipserve_inference_seconds', model, modality).observe(inference)

    def docs(self, model: str, endpoint: str, count: int) -> None:
        if self.enabled:
            self._labels('clipserve_docs_per_request', model, endpoint).observe(count)

    def error(self, model: str, error: BaseException) -> None:
        if self.enabled:
            self._labels('clipserve_errors', model, error_cause(error)).inc()

    def refused(self, model: str, limit: str) -> None:
        if self.enabled:
            self._labels('clipserve_refused', model, limit).inc()

    def queue_wait(self, model: str, modality: str, seconds: float) -> None:
        if self.enabled:
            self._labels('clipserve_queue_wait_seconds', model, modality).observe(seconds)

    def forward_pass(self, model: str, modality: str, rows: int, seconds: float) -> None:
        if self.enabled:
            self._labels('clipserve_pass_rows', model, modality).observe(rows)
            self._labels('clipserve_model_busy_seconds', model, modality).inc(seconds)

    def watch_load(self, model: str, requests: Callable[[], int], documents: Callable[[], int], rows) -> None:
        """Gauges read when Prometheus scrapes: what the replica holds, and rows waiting per modality."""
        if not self.enabled:
            return
        self._labels('clipserve_requests_in_flight', model).set_function(requests)
        self._labels('clipserve_documents_in_flight', model).set_function(documents)
        for modality in ('images', 'texts'):
            self._labels('clipserve_rows_waiting', model, modality).set_function(lambda m=modality: rows().get(m, 0))
