"""Runtimes behind one small interface. Each backend module is imported only when selected."""

from __future__ import annotations

from clipserve.backends.base import Backend, BackendOptions
from clipserve.models.names import ModelName
from clipserve.models.runtimes import BACKENDS, RERANK_BACKENDS


def create_backend(
    kind: str,
    model: str | ModelName | None,
    options: BackendOptions,
    model_path: str | None = None,
    max_batch: int | None = None,
) -> Backend:
    """Build the backend `kind` for `model` (a parsed ModelName, or a name to parse); imports the runtime only now.

    `model_path` is a directory of exported files (onnx, openvino, tensorrt); the torch backend takes its weights
    from the model name instead (`arch::/path/to/checkpoint`). `max_batch` is the largest batch the
    caller sends (the executor's minibatch_size): tensorrt builds its engines for 1..max_batch (default
    32); the other backends take any batch and ignore it.
    """
    if kind == 'torch':
        if model_path:
            raise ValueError(
                'model_path is for the onnx backend; for torch, name a checkpoint: "arch::/path/to/weights"'
            )
        from clipserve.backends.torch.backend import TorchBackend

        return TorchBackend(model, options)
    if kind == 'onnx':
        try:
            from clipserve.backends.onnx.backend import OnnxBackend
        except ImportError as e:
            from clipserve.errors import BackendUnavailableError

            raise BackendUnavailableError(
                f'the onnx backend needs onnxruntime ({e}); install the onnx extra: pip install "clipserve[onnx]"'
            ) from e
        return OnnxBackend(model, options, model_path=model_path)
    if kind == 'openvino':
        try:
            from clipserve.backends.openvino.backend import OpenVINOBackend
        except ImportError as e:
            from clipserve.errors import BackendUnavailableError

            raise BackendUnavailableError(
                f'the openvino backend needs OpenVINO ({e}); install the openvino extra: pip install "clipserve[openvino]"'
            ) from e
        return OpenVINOBackend(model, options, model_path=model_path)
    if kind == 'tensorrt':
        # The module imports without TensorRT; its constructor imports TensorRT and, when that fails,
        # raises BackendUnavailableError with the install command (never a fallback to another backend).
        from clipserve.backends.tensorrt.backend import TensorRTBackend

        extra = {} if max_batch is None else {'max_batch': max_batch}
        return TensorRTBackend(model, options, model_path=model_path, **extra)
    raise ValueError(f'unknown backend {kind!r}; choose one of: {", ".join(BACKENDS)}')


def create_cross_encoder(kind: str, spec, options, model_path: str | None = None):
    """The reranker `kind` (backends/cross_encoder.py) for `spec` (models/cross_encoder.py); `model_path`: an
    ONNX export (python -m clipserve export reranker), else the checkpoint is exported on first use into the cache."""
    from clipserve.errors import BackendUnavailableError, InvalidParameterError

    if kind == 'torch':
        if model_path:
            raise InvalidParameterError('model_path is for the onnx reranker; for torch, name the checkpoint')
        from clipserve.backends.torch.cross_encoder import TorchCrossEncoder

        return TorchCrossEncoder(spec, options)
    if kind == 'onnx':
        try:
            from clipserve.backends.onnx.cross_encoder import OnnxCrossEncoder
        except ImportError as error:
            raise BackendUnavailableError(
                f'the onnx reranker needs onnxruntime ({error}): pip install "clipserve[onnx]"'
            ) from error
        return OnnxCrossEncoder(spec, options, model_path)
    raise InvalidParameterError(f'unknown reranker backend {kind!r}; choose one of: {", ".join(RERANK_BACKENDS)}')


__all__ = ['Backend', 'BackendOptions', 'BACKENDS', 'create_backend', 'create_cross_encoder']
