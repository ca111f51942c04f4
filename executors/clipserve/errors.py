"""Exception types: one per cause, each message says what went wrong and what to do.

This module has no Jina or torch imports so every layer can raise these.
"""


class ClipServeError(Exception):
    """Base class for every error clipserve raises on purpose."""


class UnknownModelError(ClipServeError, ValueError):
    """A model name, architecture or pretrained tag that clipserve cannot resolve."""


class WeightsUnavailableError(ClipServeError, RuntimeError):
    """Weights that must be downloaded cannot be, and no cached copy exists."""


class BackendUnavailableError(ClipServeError, RuntimeError):
    """A backend or device that was asked for is not installed or not present."""


class EngineBuildError(ClipServeError, RuntimeError):
    """TensorRT could not parse the ONNX graph or build an engine from it; the message carries TensorRT's words."""


class InvalidParameterError(ClipServeError, ValueError):
    """A known parameter with a wrong type or value."""


class InvalidDocumentError(ClipServeError, ValueError):
    """One or more documents could not be encoded; the message names each one and the reason."""

    def __init__(self, failures):
        self.failures = list(failures)  # [(doc_id, reason)]
        shown = '; '.join(f'document {doc_id!r}: {reason}' for doc_id, reason in self.failures[:20])
        more = len(self.failures) - 20
        if more > 0:
            shown += f'; and {more} more'
        super().__init__(f'{len(self.failures)} document(s) could not be encoded: {shown}')
