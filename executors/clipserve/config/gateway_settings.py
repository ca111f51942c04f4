"""The gateway's settings, once: its limits and what it serves. Read once when the gateway starts, from its
arguments (the Flow's `gateway: uses_with:`), else each setting's CLIPSERVE_* variable, else its default,
into one typed object (config/reading.py). The reference in the docs is generated from this table.
"""

from __future__ import annotations

from clipserve.config.reading import Setting, read_settings
from clipserve.config.settings import MiB

MAX_INPUTS = 2048  # items per /v1 request, as OpenAI's embeddings API allows

GATEWAY_SETTINGS: tuple[Setting, ...] = (
    Setting(
        'max_request_bytes',
        'int',
        64 * MiB,
        'The largest gRPC or WebSocket message (one Jina request) the gateway takes; larger ones are refused.',
        minimum=1024,
        section='gateway',
    ),
    Setting(
        'max_body_bytes',
        'int',
        32 * MiB,
        'The largest HTTP body (any route, /post and /v1 included): 413 before it is read.',
        minimum=1024,
        section='gateway',
    ),
    Setting(
        'max_inputs', 'int', MAX_INPUTS, 'Items per /v1 request (OpenAI allows 2048).', minimum=1, section='gateway'
    ),
    Setting(
        'max_in_flight',
        'int',
        512,
        'Requests the gateway holds at once, all protocols together; more: 429 / RESOURCE_EXHAUSTED.',
        minimum=1,
        section='gateway',
    ),
    Setting(
        'max_stream_requests',
        'int',
        8,
        'Requests of one client stream (gRPC, WebSocket) or HTTP client address let through at once; more wait.',
        minimum=1,
        section='gateway',
    ),
    Setting(
        'max_queued_large',
        'int',
        32,
        "Large requests the gateway lets wait in each replica's queue (at most the replica's max_queued_requests); "
        'more: refused here, retryably, so sustained overload holds bounded memory. The rest of a queue is for '
        "clients behind Jina's own gateway (a prefetch of 1000).",
        minimum=0,
        section='gateway',
    ),
    Setting(
        'retry_after',
        'float',
        1.0,
        'Seconds a client refused for load is told to wait (Retry-After).',
        minimum=0,
        section='gateway',
    ),
    Setting(
        'readiness_interval',
        'float',
        1.0,
        "Seconds between the gateway's probes of every executor copy (`GET /readyz`, gRPC health `readiness`).",
        minimum=0.01,
        section='gateway',
    ),
    Setting(
        'openai_routes',
        'bool',
        True,
        'Serve `/v1/models`, `/v1/embeddings`, `/v1/rank`, `/v1/search` and the rerank routes on the HTTP port.',
        section='gateway',
    ),
    Setting('playground', 'bool', True, 'Serve the `/playground` page on the HTTP port.', section='gateway'),
)


def gateway_settings(environ=None, **arguments):
    """The gateway's settings from its arguments, else CLIPSERVE_* variables, else the defaults."""
    return read_settings(GATEWAY_SETTINGS, arguments, environ, 'GatewaySettings')
