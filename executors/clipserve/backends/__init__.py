"""Runtimes behind one small interface. Each backend module is imported only when selected."""

from __future__ import annotations

from clipserve.backends.base import Backend, BackendOptions

BACKENDS = ('torch', 'onnx', 'tensorrt')


def create_backend(kind: str, model: str | None, options: BackendOptions) -> Backend:
    """Build the backend `kind` for `model`; imports the runtime only now."""
    if kind == 'torch':
        from clipserve.backends.torch_backend import TorchBackend

        return TorchBackend(model, options)
    raise ValueError(f'unknown backend {kind!r}; choose one of: {", ".join(BACKENDS)}')


__all__ = ['Backend', 'BackendOptions', 'BACKENDS', 'create_backend']
