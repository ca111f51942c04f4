"""Cross-encoder rerankers: transformers `*ForSequenceClassification` checkpoints that score a (query, document)
pair with one logit (bge-reranker, ms-marco MiniLM, gte and ModernBERT rerankers, ...).

A reranker is named as transformers checkpoints are (`transformers:<hub id or folder>`, or the hub id or the
folder alone): a folder as `save_pretrained` writes it (config.json, the weights, tokenizer.json). The pairs
are tokenized by the folder's tokenizer.json with the `tokenizers` library (no torch, no transformers: the
ONNX backend serves without them), as transformers' tokenizer does it for `tokenizer(queries, documents,
truncation=True, max_length=...)`: the pair template of tokenizer.json, longest-first truncation to
`max_length` (the tokenizer's `model_max_length`, capped by the model's positions) on the side asked for, and
right padding with the pad token. A checkpoint whose classifier has more than one label is refused: its
labels' meaning is not a relevance score.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clipserve.errors import UnknownModelError, WeightsUnavailableError
from clipserve.models.hub import HubFileUnavailable, hub_snapshot

CONFIG_FILE = 'config.json'
TOKENIZER_FILE = 'tokenizer.json'
TOKENIZER_CONFIG = 'tokenizer_config.json'
PREFIX = 'transformers:'
#: position embeddings a model reserves beyond its usable length (RoBERTa family: padding_idx + 1)
RESERVED_POSITIONS = {'xlm-roberta': 2, 'roberta': 2, 'camembert': 2}
DIRECTIONS = ('right', 'left')


@dataclass(frozen=True)
class CrossEncoderSpec:
    """What serving a reranker needs to know, read from its folder."""

    name: str  # as configured
    folder: Path
    model_type: str
    max_length: int  # tokens a pair may have, special tokens included
    input_names: tuple[str, ...]  # what the model takes: input_ids, attention_mask (+ token_type_ids)
    pad_id: int


def checkpoint_folder(name: str) -> Path:
    """The reranker's folder: a local one, else the hub repository's files in the cache (downloaded once)."""
    source = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    local = Path(source).expanduser()
    if source.startswith(('/', '.', '~')) or local.is_dir():
        if not (local / CONFIG_FILE).is_file() or not (local / TOKENIZER_FILE).is_file():
            raise WeightsUnavailableError(
                f'{str(local)!r} is not a reranker checkpoint folder: it needs {CONFIG_FILE}, {TOKENIZER_FILE} '
                'and the weights (model.safetensors or pytorch_model.bin), as save_pretrained writes them'
            )
        return local
    patterns = [
        CONFIG_FILE,
        TOKENIZER_FILE,
        TOKENIZER_CONFIG,
        'special_tokens_map.json',
        'model*.safetensors*',
        'pytorch_model.bin',
    ]
    try:
        return hub_snapshot(source, patterns, required=CONFIG_FILE)
    except HubFileUnavailable as error:
        raise WeightsUnavailableError(
            f'cannot get the reranker {source!r}: {error}. It downloads on first use into the cache, which needs '
            'network access; offline, copy its files into a folder and name the folder'
        ) from error


def read_spec(name: str, folder: Path) -> CrossEncoderSpec:
    config = _json(folder / CONFIG_FILE)
    architectures = config.get('architectures') or []
    if not any(str(a).endswith('ForSequenceClassification') for a in architectures):
        raise UnknownModelError(
            f'{name} is not a cross-encoder: its config.json names {architectures or "no architecture"}, and a '
            'reranker is a *ForSequenceClassification checkpoint (bge-reranker, ms-marco MiniLM, ...)'
        )
    labels = int(config.get('num_labels') or len(config.get('id2label') or {}) or 1)
    if labels != 1:
        raise UnknownModelError(
            f'{name} classifies into {labels} labels; a reranker scores a pair with one logit (num_labels 1)'
        )
    tokenizer_config = _json(folder / TOKENIZER_CONFIG) if (folder / TOKENIZER_CONFIG).is_file() else {}
    model_type = str(config.get('model_type') or '')
    positions = int(config.get('max_position_embeddings') or 512) - RESERVED_POSITIONS.get(model_type, 0)
    declared = tokenizer_config.get('model_max_length')
    max_length = min(positions, int(declared)) if isinstance(declared, (int, float)) and declared < 1e9 else positions
    inputs = ['input_ids', 'attention_mask']
    named = tokenizer_config.get('model_input_names')  # what transformers' tokenizer gives the model
    if int(config.get('type_vocab_size') or 0) > 1 and (not isinstance(named, list) or 'token_type_ids' in named):
        inputs.append('token_type_ids')  # BERT-style pairs: segment ids 0 and 1
    tokenizer = _json(folder / TOKENIZER_FILE)
    pad = tokenizer_config.get('pad_token') or 'pad'
    pad_id = _token_id(tokenizer, pad if isinstance(pad, str) else pad.get('content', ''), config.get('pad_token_id'))
    return CrossEncoderSpec(name, folder, model_type, max_length, tuple(inputs), pad_id)


def resolve_cross_encoder(name: str) -> CrossEncoderSpec:
    return read_spec(name, checkpoint_folder(name))


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError) as error:
        raise WeightsUnavailableError(f'{path} cannot be read: {error}') from None
    if not isinstance(value, dict):
        raise WeightsUnavailableError(f'{path} is not a JSON object')
    return value


def _token_id(tokenizer: dict, token: str, fallback) -> int:
    for added in tokenizer.get('added_tokens') or ():
        if added.get('content') == token:
            return int(added['id'])
    return int(fallback or 0)


# ---- pairs to token ids -------------------------------------------------------------------------------


@dataclass
class PairBatch:
    """Token ids of pairs, right-padded to the longest pair: [N, L] each (token_type_ids: None if unused)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray | None
    lengths: np.ndarray  # [N] tokens of each pair (padding excluded)
    truncated: np.ndarray  # [N] bool: the pair was longer than max_length

    def rows(self, rows) -> tuple[np.ndarray, ...]:
        arrays = (self.input_ids[rows], self.attention_mask[rows])
        return arrays if self.token_type_ids is None else (*arrays, self.token_type_ids[rows])


class PairTokenizer:
    """(query, document) pairs as the checkpoint's tokenizer makes them, with the `tokenizers` library."""

    def __init__(self, spec: CrossEncoderSpec):
        from tokenizers import Tokenizer

        self.spec = spec
        self._tokenizer = Tokenizer.from_file(str(spec.folder / TOKENIZER_FILE))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._lock = threading.Lock()  # truncation is the tokenizer's state: one request's settings at a time

    def __call__(self, query: str, documents: list[str], max_length: int | None = None, direction: str = 'right'):
        """Every (query, document) pair; longer than `max_length` (default and most: the model's): truncated,
        longest first, on `direction`'s side."""
        limit = min(max_length or self.spec.max_length, self.spec.max_length)
        with self._lock:
            self._tokenizer.enable_truncation(limit, strategy='longest_first', direction=direction)
            cut = self._tokenizer.encode_batch([(query, d) for d in documents])
        width = max((len(e.ids) for e in cut), default=0)
        ids = np.full((len(cut), width), self.spec.pad_id, dtype=np.int64)
        mask = np.zeros((len(cut), width), dtype=np.int64)
        types = np.zeros((len(cut), width), dtype=np.int64) if 'token_type_ids' in self.spec.input_names else None
        for row, encoding in enumerate(cut):
            n = len(encoding.ids)
            ids[row, :n], mask[row, :n] = encoding.ids, 1
            if types is not None:
                types[row, :n] = encoding.type_ids
        lengths = mask.sum(axis=1)
        truncated = np.array([bool(e.overflowing) for e in cut], dtype=bool)
        return PairBatch(ids, mask, types, lengths, truncated)
