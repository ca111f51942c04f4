"""Every setting of the cross-encoder reranker (CrossEncoderRanker), once: name, type, default, variable.

Read as the encoders' settings are (settings.py). The model's settings have variables of their own
(`CLIPSERVE_RERANK_MODEL`, `CLIPSERVE_RERANK_BACKEND`, ...), so a Flow with an encoder and a reranker sets each apart; the
limits and the drain are every replica's (`CLIPSERVE_MAX_REQUESTS`, ...), shared with the encoders'.
"""

from __future__ import annotations

from clipserve.config.reading import Setting, read_settings
from clipserve.config.settings import EXECUTOR_SETTINGS
from clipserve.models.runtimes import RERANK_BACKENDS

DIRECTIONS = ('right', 'left')
PREFIX = 'CLIPSERVE_'  # a setting's variable: PREFIX + RERANK_<NAME>


def _s(name, kind, default, description, **extra) -> Setting:
    env = extra.pop('env', f'{PREFIX}RERANK_{name.upper()}')
    return Setting(name, kind, default, description, env=env, section=extra.pop('section', 'reranker'), **extra)


RERANKER_SETTINGS: tuple[Setting, ...] = (
    _s(
        'name',
        'str',
        None,
        'The reranker: a transformers *ForSequenceClassification checkpoint, as a hub id or a folder '
        '(`BAAI/bge-reranker-v2-m3`, `cross-encoder/ms-marco-MiniLM-L-6-v2`, `transformers:/path`).',
        env='CLIPSERVE_RERANK_MODEL',
    ),
    _s('backend', 'choice', 'torch', 'The runtime that serves it.', choices=RERANK_BACKENDS),
    _s(
        'model_path',
        'str',
        None,
        'onnx: an export folder (`python -m clipserve export reranker`); unset: exported on first use into the cache.',
    ),
    _s('device', 'str', None, '`cpu`, `cuda`, `cuda:1`; unset: the CPU.'),
    _s('dtype', 'str', None, '`fp32` (default on a CPU), `bf16`, `fp16` (torch), `int8` (onnx).'),
    _s('threads', 'int', None, "CPU threads for the model; unset: the runtime's default.", minimum=1),
    _s('minibatch_size', 'int', 32, 'Pairs per forward pass (requests share them).', minimum=1),
    _s(
        'batch_wait_ms',
        'float',
        5.0,
        'How long a forward pass that is not full waits for pairs of requests still on their way (0: never).',
        minimum=0,
    ),
    _s(
        'max_length',
        'int',
        None,
        "Tokens of a (query, document) pair, special tokens included; unset: the model's. A request's `max_length` "
        'may lower it.',
        minimum=4,
    ),
    *(s for s in EXECUTOR_SETTINGS if s.section == 'limits' or s.name == 'shutdown_grace'),
)


def reranker_settings(environ=None, **arguments):
    return read_settings(RERANKER_SETTINGS, arguments, environ, 'RerankerSettings')
