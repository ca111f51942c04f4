"""Every setting of an executor, once: its name, type, default, environment variable and description.

A setting's value comes from, in order: the executor's argument (Flow YAML `with:`, `uses_with`,
`--uses-with`), then its environment variable (`CLIPSERVE_*`), then its default. An argument that is
empty, None or an unexpanded `${{ ENV.X }}` (Jina leaves `$X` when X is unset) counts as not given.
Lists are lists, or one comma-separated string (as environment variables and `--uses-with` give them);
numbers must be finite and within their range; a wrong value is an InvalidParameterError naming the
setting and what it accepts, at start. The reference in the docs is generated from this table.
"""

from __future__ import annotations

import dataclasses

from clipserve.config.parameters import check_access_paths, check_bool, env_or_default
from clipserve.config.reading import Setting, read_settings
from clipserve.engine.small_requests import SMALL
from clipserve.models.runtimes import BACKENDS

MiB = 1024 * 1024


def _s(name, kind, default, description, **extra) -> Setting:
    return Setting(name, kind, default, description, **extra)


EXECUTOR_SETTINGS: tuple[Setting, ...] = (
    # the model and where it runs
    _s(
        'name',
        'str',
        'ViT-B-32::openai',
        'The model, `arch::pretrained` or one of the other forms (docs/concepts/models.md).',
        env='CLIPSERVE_MODEL',
    ),
    _s('backend', 'choice', 'torch', 'The runtime that serves it.', choices=BACKENDS),
    _s(
        'model_path',
        'str',
        None,
        'onnx, openvino, tensorrt: a directory with visual.onnx and textual.onnx (an export).',
    ),
    _s('device', 'str', None, '`cpu`, `cuda`, `cuda:1`, `gpu` (OpenVINO); unset: CUDA where present, else the CPU.'),
    _s(
        'dtype',
        'str',
        None,
        '`fp32`, `fp16`, `bf16`, `int8` or `auto` (unset): the fastest precision this CPU/GPU computes natively.',
    ),
    _s(
        'threads',
        'int',
        None,
        'CPU threads for the model; unset: the cores divided by the copies (replicas x shards) of this executor.',
        minimum=1,
    ),
    _s('trust_remote_code', 'bool', False, 'transformers checkpoints: run model code shipped with the checkpoint.'),
    _s(
        'truncate_dim',
        'int',
        None,
        'Matryoshka-trained transformers checkpoints: keep the first N dimensions.',
        minimum=1,
    ),
    _s(
        'pool_factor',
        'int',
        1,
        "Late-interaction models (ColPali, ColQwen2): pool each page's vectors this many to one (1: off); "
        'requests may send their own `pool_factor`.',
        minimum=1,
    ),
    # batching
    _s(
        'minibatch_size',
        'int',
        32,
        'Rows (texts, or images on a GPU) per forward pass; images on a CPU run 8 at a time.',
        minimum=1,
        section='batching',
    ),
    _s('num_worker_preprocess', 'int', 4, 'Threads decoding and preprocessing images.', minimum=1, section='batching'),
    _s(
        'batch_requests',
        'bool',
        True,
        'Merge concurrent requests into shared forward passes (dynamic batching).',
        section='batching',
    ),
    _s(
        'batch_wait_ms',
        'float',
        5.0,
        'How long a forward pass that is not full waits for requests still on their way (0: it never waits).',
        minimum=0,
        section='batching',
    ),
    _s(
        'access_paths',
        'str',
        '@r',
        'DocArray selector of the documents to encode (`traversal_paths`: its old name).',
        section='batching',
    ),
    # inputs
    _s(
        'allow_local_files',
        'bool',
        False,
        'Read images from server-side paths named by clients (off: secure by default).',
        section='inputs',
    ),
    _s('local_files_root', 'str', None, 'With allow_local_files: only files under this directory.', section='inputs'),
    _s(
        'allow_remote_uris',
        'bool',
        False,
        'Fetch http(s) image URLs named by clients (off: secure by default).',
        section='inputs',
    ),
    _s(
        'remote_allowed_hosts',
        'list',
        (),
        'Hosts, addresses or CIDR networks exempt from the public-address check (comma-separated).',
        section='inputs',
    ),
    _s('remote_timeout', 'float', 10.0, 'Seconds for one fetch, redirects included.', minimum=0.001, section='inputs'),
    _s(
        'max_image_bytes',
        'int',
        20 * MiB,
        'Largest encoded image (blob, data: URI, file or download).',
        minimum=1,
        section='inputs',
    ),
    _s(
        'max_image_pixels',
        'int',
        50_000_000,
        'Largest decoded image, in pixels (decompression bombs are refused).',
        minimum=1,
        section='inputs',
    ),
    _s(
        'jpeg_draft',
        'bool',
        False,
        "Decode large JPEGs at a reduced scale (faster; not bit-exact with open_clip's preprocessing).",
        section='inputs',
    ),
    _s(
        'fetch_threads',
        'int',
        16,
        'Threads fetching image URLs and files, shared by all requests of the replica.',
        minimum=1,
        section='inputs',
    ),
    _s('fetch_concurrency', 'int', 4, 'Fetches one request may run at once.', minimum=1, section='inputs'),
    _s(
        'fetch_seconds',
        'float',
        60.0,
        "Seconds one request's fetches may take in all; later ones fail, each naming why.",
        minimum=0.001,
        section='inputs',
    ),
    _s('fetch_max_bytes', 'int', 512 * MiB, 'Bytes one request may fetch in all.', minimum=1, section='inputs'),
    # limits
    _s(
        'max_requests',
        'int',
        16,
        'Requests a replica works on at once; more wait in its queue (max_queued_*).',
        minimum=1,
        section='limits',
    ),
    _s(
        'max_documents',
        'int',
        4096,
        'Documents a replica works on at once; a request that would pass it waits for room (a larger one runs alone).',
        minimum=1,
        section='limits',
    ),
    _s(
        'small_request_reserve',
        'int',
        64,
        f'Places beyond max_requests that only requests of at most {SMALL.documents} documents (a query, '
        'a caption) may take, so large requests that fill a replica cannot refuse them.',
        minimum=0,
        section='limits',
    ),
    _s(
        'max_queued_requests',
        'int',
        1024,
        'Requests that may wait for a place (first come, first served); more are refused (429 / '
        'RESOURCE_EXHAUSTED) to retry.',
        minimum=0,
        section='limits',
    ),
    _s(
        'max_queued_documents',
        'int',
        262_144,
        'Documents the waiting requests may hold together; a request that would pass it is refused to retry.',
        minimum=1,
        section='limits',
    ),
    _s(
        'max_queued_bytes',
        'int',
        512 * MiB,
        'Content bytes (texts, images, URIs) the waiting requests may hold together; past it, refused to retry.',
        minimum=1,
        section='limits',
    ),
    _s(
        'max_request_seconds',
        'float',
        300.0,
        "The longest a request may take; a request's `timeout_seconds` parameter may shorten it.",
        minimum=0.001,
        section='limits',
    ),
    # routing and lifecycle
    _s(
        'serve_default',
        'bool',
        True,
        'Answer requests that name no model (multi-model Flows: exactly one executor does).',
        section='routing',
    ),
    _s(
        'served_models',
        'list',
        (),
        "Every model of a multi-model Flow (comma-separated), so requests for another's pass through.",
        section='routing',
    ),
    _s(
        'shutdown_grace',
        'float',
        30.0,
        'Seconds requests in flight get to finish on SIGTERM/SIGINT.',
        minimum=0,
        section='routing',
    ),
)


def executor_settings(environ=None, **arguments):
    """An executor's settings, checked; the deprecated `traversal_paths` sets `access_paths`, and clip-as-service's
    `jit` (TorchScript, which clipserve does not run) is accepted and ignored, saying so when it is on."""
    old = env_or_default(arguments.pop('traversal_paths', None), None)
    jit = arguments.pop('jit', None)
    warnings = []
    if old is not None:
        arguments['access_paths'] = old
        warnings.append('"traversal_paths" is deprecated; use "access_paths"')
    if jit is not None and check_bool('jit', jit):
        warnings.append('"jit" (TorchScript) is ignored: the model runs as it is')
    values = read_settings(EXECUTOR_SETTINGS, arguments, environ, 'ExecutorSettings', warnings=tuple(warnings))
    return dataclasses.replace(values, access_paths=check_access_paths('access_paths', values.access_paths))
