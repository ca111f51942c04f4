"""Every CLIPSERVE_* variable that is not a setting's, declared once: its name, what reads it, what it does.

A setting's variable is in its table (config/settings.py and the other tables: CLIPSERVE_<NAME>, read with
its argument and default). These are the others: switches for odd machines, the cache, the token. The code
reads each through its Variable here (`environment.CACHE.value()`), so a variable has one spelling, and the
docs' environment reference is generated from this list and the tables (docs/hooks/docgen/settings.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    read_by: str  # for the reference: who reads it
    description: str

    def __str__(self) -> str:
        return self.name

    def value(self, environ=None) -> str | None:
        """Its value in `environ` (default: this process's environment); None when unset or empty."""
        found = (os.environ if environ is None else environ).get(self.name)
        return found if found else None

    def on(self, environ=None) -> bool:
        """A switch: set to 1, true, yes or on."""
        return str(self.value(environ) or '').strip().lower() in ('1', 'true', 'yes', 'on')


AUTH_TOKEN = Variable(
    'CLIPSERVE_AUTH_TOKEN',
    '`ClipServeGateway` (`flows/auth.yml`), `clipserve serve --token`; `clipserve_client`, `clipserve embed --server`',
    'The shared token every request must carry; the clients send it by default (a `--token` or `token=` wins).',
)
OLD_TOKEN = Variable('CLIPSERVE_TOKEN', '`clipserve embed --server`', 'Deprecated (a warning): `CLIPSERVE_AUTH_TOKEN`.')
AUTH = Variable(
    'CLIPSERVE_AUTH',
    '`ClipServeGateway`',
    'The gateway argument `auth` where not given: `required`, `optional`, `off`.',
)
TLS_CERT = Variable('CLIPSERVE_TLS_CERT', '`flows/tls.yml`, `flows/secure-v2.yml`', "The gateway's certificate (PEM).")
TLS_KEY = Variable('CLIPSERVE_TLS_KEY', '`flows/tls.yml`, `flows/secure-v2.yml`', "The gateway's private key (PEM).")
CACHE = Variable(
    'CLIPSERVE_CACHE',
    'every backend, `python -m clipserve export`',
    'The cache of weights, tokenizers, ONNX exports and converted copies; default `$XDG_CACHE_HOME/clipserve`, '
    'else `~/.cache/clipserve`.',
)
CPU_BF16 = Variable(
    'CLIPSERVE_CPU_BF16',
    '`dtype: auto` on every backend',
    "`1` or `0`: override what the CPU's flags say about native bf16 (odd hypervisors, tests).",
)
INT8_FORCE = Variable(
    'CLIPSERVE_INT8_FORCE',
    "`dtype: int8`; the rerankers' reduced precisions",
    "`1`: serve int8 (or a reranker's bf16/int8) even where it was measured to change rankings (logged).",
)
KEEP_TRITON = Variable(
    'CLIPSERVE_KEEP_TRITON',
    'torch on a CPU',
    '`1`: let a CPU replica import Triton (by default it is kept out: about 75 MB per replica).',
)
MAX_GRPC_MESSAGE_BYTES = Variable(
    'CLIPSERVE_MAX_GRPC_MESSAGE_BYTES',
    "Jina's gRPC servers (executors, heads)",
    'The largest gRPC message a server accepts.',
)

VARIABLES = (AUTH_TOKEN, OLD_TOKEN, AUTH, TLS_CERT, TLS_KEY, CACHE, CPU_BF16, INT8_FORCE, KEEP_TRITON,
             MAX_GRPC_MESSAGE_BYTES)  # fmt: skip
