"""Hugging Face tokenizers without torch or transformers: the model's own `tokenizer.json`, read by the
`tokenizers` library, called the way open_clip's HFTokenizer calls transformers.

open_clip cleans each text (`clean`: 'whitespace', 'canonicalize' or 'lower'), then asks for
`max_length=context_length, padding='max_length', truncation=True`, and optionally replaces the
separator token by 0 (`strip_sep_token`). transformers applies that as the tokenizer's truncation
(longest first, on the side `tokenizer_config.json` names) and padding (to exactly the context, with
the configured pad token and side) around `tokenizer.json`'s own pipeline; so do we.
"""

from __future__ import annotations

import html
import string
from pathlib import Path
from typing import Sequence

import ftfy
import numpy as np

from clipserve.models.json_files import read_json_object
from clipserve.models.tokenizer import TokenBatch

TOKENIZER_FILE = 'tokenizer.json'
# what open_clip's HFTokenizer (through transformers) reads from a tokenizer folder; copied with the weights
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    'tokenizer_config.json',
    'special_tokens_map.json',
    'added_tokens.json',
    'sentencepiece.bpe.model',
    'spiece.model',
    'tokenizer.model',
    'vocab.txt',
    'vocab.json',
    'merges.txt',
)


class TokenizerFilesError(ValueError):
    """The tokenizer files are missing or do not say what open_clip needs (e.g. no pad token)."""


def _basic_clean(text: str) -> str:
    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def _whitespace(text: str) -> str:
    return ' '.join(text.split()).strip()


_PUNCTUATION = str.maketrans('', '', string.punctuation)


def _canonicalize(text: str) -> str:
    """big_vision's canonicalisation, as open_clip applies it: '_' to space, punctuation removed, lower case."""
    text = text.replace('_', ' ').translate(_PUNCTUATION).lower()
    return ' '.join(text.split()).strip()


CLEANERS = {
    'whitespace': lambda t: _whitespace(_basic_clean(t)),
    'lower': lambda t: _whitespace(_basic_clean(t)).lower(),
    'canonicalize': lambda t: _canonicalize(_basic_clean(t)),
    'none': lambda t: t,  # M-CLIP and CN-CLIP hand texts to their tokenizers as they are
    'siglip2': lambda t: t,  # the texts as they are, into _as_siglip2's tokenizer
}


def _as_siglip2(tokenizer, config: dict) -> None:
    """What transformers' Siglip2Tokenizer does to tokenizer.json when it loads it (SigLIP2 was trained on
    lowercased text): tokenizers' Lowercase before the file's normalizer (when it has one), and padding on
    the left unless tokenizer_config.json names a side."""
    from tokenizers import normalizers

    if tokenizer.normalizer is not None:
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), tokenizer.normalizer])
    config.setdefault('padding_side', 'left')


def _token_content(value) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json write it (a string or an AddedToken dict)."""
    if isinstance(value, dict):
        return value.get('content')
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    return read_json_object(path, TokenizerFilesError)


def special_tokens(folder: Path) -> dict[str, str]:
    """The folder's named special tokens ('pad_token': '<pad>', ...), as tokenizer_config.json and
    special_tokens_map.json give them (the former wins)."""
    config = {**_read_json(folder / 'special_tokens_map.json'), **_read_json(folder / 'tokenizer_config.json')}
    found = {key: _token_content(value) for key, value in config.items() if key.endswith('_token')}
    return {key: value for key, value in found.items() if value is not None}


class HFTokenizer:
    """Token ids for a model whose text side uses a Hugging Face tokenizer (SigLIP, XLM-R, mT5, BERT...)."""

    def __init__(
        self, folder: str | Path, context_length: int, clean: str = 'whitespace', strip_sep_token: bool = False
    ):
        from tokenizers import Tokenizer as RustTokenizer

        folder = Path(folder)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerFilesError(
                f'{str(folder)!r} has no {TOKENIZER_FILE}: clipserve reads Hugging Face tokenizers from their '
                f'{TOKENIZER_FILE} (the "fast" tokenizer file the model repository ships)'
            )
        if clean not in CLEANERS:
            raise TokenizerFilesError(f'unknown text cleaning {clean!r}; known: {", ".join(CLEANERS)}')
        self.context_length = int(context_length)
        self._clean = CLEANERS[clean]
        self._tokenizer = RustTokenizer.from_file(str(path))
        config = {**_read_json(folder / 'special_tokens_map.json'), **_read_json(folder / 'tokenizer_config.json')}
        if clean == 'siglip2':
            _as_siglip2(self._tokenizer, config)
        pad = _token_content(config.get('pad_token'))
        self.pad_id = self._tokenizer.token_to_id(pad) if pad is not None else None
        if self.pad_id is None:
            raise TokenizerFilesError(
                f'the tokenizer in {str(folder)!r} has no pad token (tokenizer_config.json "pad_token"), '
                'which padding to the context length needs'
            )
        sep = _token_content(config.get('sep_token'))
        self._sep_id = self._tokenizer.token_to_id(sep) if (strip_sep_token and sep is not None) else None
        self._tokenizer.enable_truncation(
            max_length=self.context_length,
            stride=0,
            strategy='longest_first',
            direction=config.get('truncation_side', 'right'),
        )
        self._tokenizer.enable_padding(
            direction=config.get('padding_side', 'right'),
            pad_id=self.pad_id,
            pad_type_id=0,
            pad_token=pad,
            length=self.context_length,
        )
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, texts: str | Sequence[str]) -> TokenBatch:
        if isinstance(texts, str):
            texts = [texts]
        encodings = self._tokenizer.encode_batch([self._clean(t) for t in texts])
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64).reshape(len(texts), self.context_length)
        attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64).reshape(input_ids.shape)
        if self._sep_id is not None:
            input_ids[input_ids == self._sep_id] = 0
        return TokenBatch(input_ids=input_ids, attention_mask=attention_mask, lengths=attention_mask.sum(axis=1))
