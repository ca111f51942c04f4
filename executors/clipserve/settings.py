"""An executor's settings: its constructor arguments and their environment defaults, checked once.

Flow YAMLs pass `${{ ENV.X }}`, which Jina leaves as the literal `$X` when X is unset: such a value
(or an empty one) means "the default". A wrong type or value is an InvalidParameterError naming the
argument. No Jina here: the executor builds this record, then builds everything else from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clipserve.backends import BACKENDS
from clipserve.errors import InvalidParameterError
from clipserve.models.names import DEFAULT_MODEL, ModelName, parse_model_name
from clipserve.options import check_access_paths, check_bool, check_int, env_or_default
from clipserve.uris import UriPolicy

GRACE_ENV = 'CLIPSERVE_SHUTDOWN_GRACE'
DEFAULT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class ExecutorSettings:
    name: str  # as configured (an alias such as ViT-B/32 stays as written)
    model: ModelName  # the name parsed, once: what the backend gets
    backend: str
    device: str | None
    dtype: str | None
    model_path: str | None
    minibatch_size: int
    num_worker_preprocess: int
    access_paths: str
    uri_policy: UriPolicy
    max_image_pixels: int
    jpeg_draft: bool
    serve_default: bool
    served_models: tuple[str, ...]  # empty: only this executor's model
    batch_requests: bool | None  # None: on when the executor runs with allow_concurrent
    batch_wait_seconds: float
    shutdown_grace: float
    trust_remote_code: bool = False  # transformers checkpoints: run model code shipped with them
    truncate_dim: int | None = None  # Matryoshka-trained transformers checkpoints: keep the first N dimensions
    warnings: tuple[str, ...] = ()  # deprecated arguments used, for the executor's log


def shutdown_seconds(configured, environ=None) -> float:
    """The grace period: the executor argument, else $CLIPSERVE_SHUTDOWN_GRACE, else 30 s; 0 means none."""
    environ = os.environ if environ is None else environ
    value = configured if configured not in (None, '') else environ.get(GRACE_ENV) or DEFAULT_GRACE_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f'shutdown_grace must be a number of seconds, got {value!r}') from None
    if not seconds >= 0:  # also refuses NaN
        raise InvalidParameterError(f'shutdown_grace must be >= 0 seconds, got {value!r}')
    return seconds


def executor_settings(
    name=DEFAULT_MODEL,
    backend='torch',
    device=None,
    dtype=None,
    minibatch_size=32,
    num_worker_preprocess=4,
    access_paths='@r',
    allow_local_files=False,
    local_files_root=None,
    allow_remote_uris=False,
    remote_allowed_hosts=None,
    remote_timeout=10.0,
    max_image_bytes=20 * 1024 * 1024,
    max_image_pixels=50_000_000,
    jpeg_draft=False,
    model_path=None,
    serve_default=True,
    served_models=None,
    batch_requests=None,
    batch_wait_ms=5.0,
    traversal_paths=None,
    shutdown_grace=None,
    trust_remote_code=False,
    truncate_dim=None,
) -> ExecutorSettings:
    """The checked settings from CLIPExecutorBase's arguments (the same names and defaults)."""
    backend = env_or_default(backend, 'torch')
    if backend not in BACKENDS:
        raise InvalidParameterError(f'backend must be one of {", ".join(BACKENDS)}, got {backend!r}')
    warnings = []
    if traversal_paths is not None:
        warnings.append('"traversal_paths" is deprecated; use "access_paths"')
        access_paths = traversal_paths
    try:
        remote_timeout = float(remote_timeout)
        batch_wait_seconds = float(batch_wait_ms) / 1000
    except (TypeError, ValueError) as e:
        raise InvalidParameterError(f'remote_timeout and batch_wait_ms must be numbers ({e})') from None
    name = str(env_or_default(name, DEFAULT_MODEL))
    try:
        model = parse_model_name(name)
    except ValueError as e:
        raise InvalidParameterError(f'name: {e}') from None
    return ExecutorSettings(
        name=name,
        model=model,
        backend=backend,
        device=env_or_default(device, None),
        dtype=env_or_default(dtype, None),
        model_path=env_or_default(model_path, None),
        minibatch_size=check_int('minibatch_size', minibatch_size),
        num_worker_preprocess=check_int('num_worker_preprocess', num_worker_preprocess),
        access_paths=check_access_paths('access_paths', access_paths),
        uri_policy=UriPolicy(
            allow_local_files=check_bool('allow_local_files', allow_local_files),
            local_files_root=env_or_default(local_files_root, None),
            allow_remote=check_bool('allow_remote_uris', allow_remote_uris),
            allowed_hosts=tuple(str(h) for h in (remote_allowed_hosts or ())),
            remote_timeout=remote_timeout,
            max_bytes=check_int('max_image_bytes', max_image_bytes),
        ),
        max_image_pixels=check_int('max_image_pixels', max_image_pixels),
        jpeg_draft=check_bool('jpeg_draft', jpeg_draft),
        serve_default=check_bool('serve_default', serve_default),
        served_models=tuple(str(m) for m in (served_models or ())),
        batch_requests=None if batch_requests in (None, '') else check_bool('batch_requests', batch_requests),
        batch_wait_seconds=batch_wait_seconds,
        shutdown_grace=shutdown_seconds(env_or_default(shutdown_grace, None)),
        trust_remote_code=check_bool('trust_remote_code', env_or_default(trust_remote_code, False)),
        truncate_dim=None if env_or_default(truncate_dim, None) is None else check_int('truncate_dim', truncate_dim),
        warnings=tuple(warnings),
    )
