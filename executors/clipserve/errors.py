"""Exception types: one per cause, each message says what went wrong and what to do.

Each type is a kind with a code, the HTTP status and the gRPC status a gateway answers it with, and
whether a client may retry it. An executor's exception reaches the gateway as its class name and
arguments (Jina's error header), so gateways map it by `kind_named(name)`, never by its message.
Structured details (which documents failed, the limit that was hit) travel as the second argument,
JSON. This module imports nothing, so every layer can raise these.
"""

from __future__ import annotations

import json


class ClipServeError(Exception):
    """Base class for every error clipserve raises on purpose."""

    code = 'internal_error'
    http_status = 500
    grpc_status = 'INTERNAL'
    retryable = False

    def __init__(self, message: str = '', details: dict | None = None):
        self.details = dict(details or {})
        if self.details:
            super().__init__(message, json.dumps(self.details))
        else:
            super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ''

    def __str__(self) -> str:
        return self.message


class UnknownModelError(ClipServeError, ValueError):
    """A model name, architecture or pretrained tag that clipserve cannot resolve."""

    code, http_status, grpc_status = 'model_not_found', 404, 'NOT_FOUND'


class WeightsUnavailableError(ClipServeError, RuntimeError):
    """Weights that must be downloaded cannot be, and no cached copy exists."""

    code, http_status, grpc_status = 'weights_unavailable', 503, 'UNAVAILABLE'


class BackendUnavailableError(ClipServeError, RuntimeError):
    """A backend or device that was asked for is not installed or not present."""

    code, http_status, grpc_status = 'backend_unavailable', 503, 'UNAVAILABLE'


class EngineBuildError(ClipServeError, RuntimeError):
    """TensorRT could not parse the ONNX graph or build an engine from it; the message carries TensorRT's words."""

    code, http_status, grpc_status = 'engine_build_failed', 500, 'INTERNAL'


class InvalidParameterError(ClipServeError, ValueError):
    """A known parameter with a wrong type or value."""

    code, http_status, grpc_status = 'invalid_parameter', 400, 'INVALID_ARGUMENT'


class InvalidDocumentError(ClipServeError, ValueError):
    """One or more documents could not be encoded; the message names each one and the reason."""

    code, http_status, grpc_status = 'invalid_document', 400, 'INVALID_ARGUMENT'

    def __init__(self, failures, done: str = 'encoded'):
        self.failures = [(str(doc_id), str(reason)) for doc_id, reason in failures]  # [(doc_id, reason)]
        shown = '; '.join(f'document {doc_id!r}: {reason}' for doc_id, reason in self.failures[:20])
        more = len(self.failures) - 20
        if more > 0:
            shown += f'; and {more} more'
        message = f'{len(self.failures)} document(s) could not be {done}: {shown}'
        super().__init__(message, {'failures': [list(f) for f in self.failures]})


class PayloadTooLargeError(ClipServeError, ValueError):
    """A request over a size limit (bytes, documents, inputs): refused before it is read or parsed."""

    code, http_status, grpc_status = 'payload_too_large', 413, 'RESOURCE_EXHAUSTED'


class OverloadedError(ClipServeError, RuntimeError):
    """The server holds as many requests as it may: try again later (the details say which limit, and when)."""

    code, http_status, grpc_status = 'overloaded', 429, 'RESOURCE_EXHAUSTED'
    retryable = True

    def __init__(self, message: str, limit: str, retry_after: float = 1.0):
        self.limit = limit
        self.retry_after = retry_after
        super().__init__(message, {'limit': limit, 'retry_after': retry_after})


class DeadlineExceededError(ClipServeError, TimeoutError):
    """The request's deadline passed before it was computed: dropped, not computed."""

    code, http_status, grpc_status = 'deadline_exceeded', 504, 'DEADLINE_EXCEEDED'
    retryable = True


class VectorStoreError(ClipServeError, RuntimeError):
    """The vector index could not be opened, read or written (an unwritable or full disk, a dead engine, a
    dimension that does not match the index); the message carries the engine's words and what to do."""

    code, http_status, grpc_status = 'index_unavailable', 503, 'UNAVAILABLE'


KINDS = {
    kind.__name__: kind
    for kind in (
        ClipServeError,
        UnknownModelError,
        WeightsUnavailableError,
        BackendUnavailableError,
        EngineBuildError,
        InvalidParameterError,
        InvalidDocumentError,
        PayloadTooLargeError,
        OverloadedError,
        DeadlineExceededError,
        VectorStoreError,
    )
}


def kind_named(name: str | None) -> type[ClipServeError]:
    """The error kind of an exception's class name as an executor reports it; unknown names are internal errors."""
    return KINDS.get(str(name or ''), ClipServeError)


def details_of(args) -> dict:
    """The structured details an executor's exception carried (its second argument), or {}."""
    if len(args) < 2:
        return {}
    try:
        details = json.loads(args[1])
    except (TypeError, ValueError):
        return {}
    return details if isinstance(details, dict) else {}
