"""CLIP's text tokenizer without torch, for serving paths (ONNX) that only have numpy.

Token for token equal to open_clip's `SimpleTokenizer` with its default `clean='lower'`: ftfy,
HTML entities unescaped twice, whitespace collapsed, lower-cased, then byte-level BPE over
OpenAI's vocabulary (`bpe_simple_vocab_16e6.txt.gz`, MIT licensed, shipped next to this file).

A request may carry a megabyte of text while CLIP reads only 75 tokens, so long texts are
cleaned (text_cleaning.py) and encoded in growing prefixes, each provably giving the same tokens as
the whole text. BPE runs per word. A word too long to encode whole is encoded from a window, and only the
  symbols that no merge across the window's end could have changed are kept (`_merge`).
"""

from __future__ import annotations

import functools
import gzip
import heapq
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import regex

from clipserve.models.text_cleaning import CleanStream, clean_text
from clipserve.models.text_spec import DEFAULT_CONTEXT_LENGTH

VOCAB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bpe_simple_vocab_16e6.txt.gz')

_NUM_MERGES = 49152 - 256 - 2  # the slice of the merges file CLIP was trained with
_SPECIAL_TOKENS = ('<start_of_text>', '<end_of_text>')
# open_clip's pre-tokenizer, special tokens first so that they encode as themselves.
_PIECE_RE = regex.compile(
    '|'.join(_SPECIAL_TOKENS) + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
    regex.IGNORECASE,
)

_FIRST_PREFIX = 4096  # characters of raw text tried first; doubled while more tokens are needed
_CACHE_SIZE = 1 << 14  # words whose BPE is remembered; bounded so random input cannot grow it
_CACHE_MAX_CHARS = 64  # longer words are rare and not worth remembering
_LONG_WORD = 512  # words longer than this (in characters) are encoded from a window when possible
_FIRST_WINDOW = 256  # characters of a long word tried first; doubled while more tokens are needed


def _byte_alphabet() -> tuple[list[int], dict[int, str]]:
    """GPT-2's byte alphabet: the vocabulary order of the 256 bytes, and a printable character for each.

    Printable bytes stand for themselves; the others move above U+00FF, so that BPE never sees
    whitespace or control characters.
    """
    printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable}
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return printable + others, chars


def _load_merges(path: str) -> list[tuple[str, str]]:
    """The merges CLIP uses, best first (the file's first line is a header)."""
    with gzip.open(path, 'rt', encoding='utf-8') as f:
        lines = f.read().split('\n')
    return [tuple(line.split()) for line in lines[1 : _NUM_MERGES + 1]]


# --- BPE -------------------------------------------------------------------------------------------


def _merge(
    symbols: list[str],
    ranks: dict[tuple[str, str], int],
    next_tokens: Callable[[int], list[str]] | None = None,
) -> tuple[list[str], int]:
    """Apply the BPE merges to `symbols` exactly as open_clip's bpe() does; return them and how many are final.

    open_clip repeatedly merges every occurrence, left to right, of the adjacent pair with the
    lowest rank. Merges only ever create pairs of higher rank, so popping (rank, position) from a
    heap performs the same merges in the same order, in n log n rather than n^2.

    With `next_tokens`, `symbols` is only the start of a word, and `next_tokens(i)` lists every
    token the rest of the word could put at position i. Symbols from the `frontier` on may then
    differ from the whole word's: a symbol joins them when it merges with one, or when a token
    that may follow it could merge with it while it lives. Only symbols before it are final.
    """
    n = len(symbols)
    sym: list[str | None] = list(symbols)
    nxt = [*range(1, n), -1]
    prv = [*range(-1, n - 1)]
    heap = [(r, i, 0) for i in range(n - 1) if (r := ranks.get((symbols[i], symbols[i + 1]))) is not None]
    heapq.heapify(heap)
    frontier = n
    edge = n - 1  # the last final symbol, right before the frontier

    def watch(rank: int) -> None:
        """Schedule the check for `edge`: the first rank above `rank` at which a follower could merge with it."""
        if edge < 0:
            return
        left = sym[edge]
        found = [r for y in next_tokens(frontier) if (r := ranks.get((left, y))) is not None and r > rank]
        if found:
            heapq.heappush(heap, (min(found), edge, 1))

    if next_tokens is not None:
        watch(-1)
    while heap:
        rank, i, check = heapq.heappop(heap)
        if check:
            if i == edge:  # still the edge: a merge across the frontier might happen now
                frontier, edge = i, prv[i]
                watch(rank)
            continue
        j = nxt[i]
        if sym[i] is None or j < 0 or ranks.get((sym[i], sym[j])) != rank:
            continue  # stale: one of the two has merged since
        sym[i] = sym[i] + sym[j]
        sym[j] = None
        nxt[i] = nxt[j]
        if nxt[i] >= 0:
            prv[nxt[i]] = i
        if next_tokens is not None:
            if j >= frontier > i:
                frontier, edge = i, prv[i]
                watch(rank)
            elif j == edge:
                edge = i
                watch(rank)
        if prv[i] >= 0 and (r := ranks.get((sym[prv[i]], sym[i]))) is not None:
            heapq.heappush(heap, (r, prv[i], 0))
        if nxt[i] >= 0 and (r := ranks.get((sym[i], sym[nxt[i]]))) is not None:
            heapq.heappush(heap, (r, i, 0))
    merged = [s for s in sym if s is not None]
    return merged, sum(1 for i, s in enumerate(sym) if s is not None and i < frontier)


@dataclass(frozen=True)
class TokenBatch:
    """Token ids ready for a CLIP text tower, with the mask and lengths an exported model may need."""

    input_ids: np.ndarray  # int64 [B, context_length]: <sot> tokens <eot>, zero padded; a truncated row ends in <eot>
    attention_mask: np.ndarray  # int64 [B, context_length]: 1 on real tokens (sot..eot), else 0
    lengths: np.ndarray  # int64 [B]: real tokens per row (sot..eot inclusive)


class Tokenizer:
    """open_clip's SimpleTokenizer (clean='lower', truncating), in numpy."""

    def __init__(self, context_length: int = DEFAULT_CONTEXT_LENGTH, vocab_path: str | None = None):
        if context_length < 2:
            raise ValueError(f'context_length must leave room for <sot> and <eot>, got {context_length}')
        self.context_length = context_length
        order, alphabet = _byte_alphabet()
        merges = _load_merges(vocab_path or VOCAB_PATH)
        vocab = [alphabet[b] for b in order]
        vocab += [c + '</w>' for c in vocab]
        vocab += [a + b for a, b in merges]
        vocab += _SPECIAL_TOKENS
        self._encoder = {token: i for i, token in enumerate(vocab)}
        self._ranks = {pair: i for i, pair in enumerate(merges)}
        self._specials = {token: self._encoder[token] for token in _SPECIAL_TOKENS}
        self._to_symbols = str.maketrans({chr(b): c for b, c in alphabet.items()})
        self._longest_token = max(len(t.removesuffix('</w>')) for t in vocab)
        self.vocab_size = len(vocab)
        self.sot_token_id = self._specials['<start_of_text>']
        self.eot_token_id = self._specials['<end_of_text>']
        # Per instance, so that the cache goes away with the tokenizer.
        self._word_ids = functools.lru_cache(maxsize=_CACHE_SIZE)(self._encode_word)

    def __call__(self, texts: str | Sequence[str]) -> TokenBatch:
        """Tokenize a text or a batch; texts longer than the context are truncated, ending in <eot>."""
        if isinstance(texts, str):
            texts = [texts]
        width = self.context_length
        input_ids = np.zeros((len(texts), width), dtype=np.int64)
        lengths = np.zeros(len(texts), dtype=np.int64)
        for row, text in enumerate(texts):
            ids = [self.sot_token_id, *self.encode(text, max_tokens=width - 2), self.eot_token_id]
            input_ids[row, : len(ids)] = ids
            lengths[row] = len(ids)
        attention_mask = (np.arange(width) < lengths[:, None]).astype(np.int64)
        return TokenBatch(input_ids=input_ids, attention_mask=attention_mask, lengths=lengths)

    def encode(self, text: str, max_tokens: int | None = None) -> list[int]:
        """BPE ids of the cleaned text (no <sot>/<eot>), at most `max_tokens` of them.

        With `max_tokens`, only as much of the text as those tokens need is cleaned and encoded.
        """
        if not isinstance(text, str):
            raise TypeError(f'expected str, got {type(text).__name__}')
        if max_tokens is None:
            return self._encode_clean(clean_text(text), None)
        if max_tokens <= 0:
            return []
        stream = CleanStream(text)
        ids: list[int] = []
        size = _FIRST_PREFIX
        while len(ids) < max_tokens and not stream.finished:
            ids += self._encode_clean(stream.next_words(size), max_tokens - len(ids))
            size *= 2
        return ids[:max_tokens]

    def _encode_clean(self, text: str, limit: int | None) -> list[int]:
        """Ids of cleaned text, stopping once `limit` are produced."""
        ids: list[int] = []
        for match in _PIECE_RE.finditer(text):
            word = match.group()
            special = self._specials.get(word)
            if special is not None:
                ids.append(special)
            elif limit is not None and len(word) > _LONG_WORD:
                ids += self._encode_long_word(word, limit - len(ids))
            elif len(word) <= _CACHE_MAX_CHARS:
                ids += self._word_ids(word)
            else:
                ids += self._encode_word(word)
            if limit is not None and len(ids) >= limit:
                return ids[:limit]
        return ids

    def _symbols(self, word: str) -> str:
        """The word's UTF-8 bytes as BPE's printable characters, one per byte."""
        return word.encode('utf-8', 'surrogatepass').decode('latin-1').translate(self._to_symbols)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        chars = self._symbols(word)
        symbols = [*chars[:-1], chars[-1] + '</w>']
        merged, _ = _merge(symbols, self._ranks)
        return tuple(self._encoder[s] for s in merged)

    def _encode_long_word(self, word: str, need: int) -> list[int]:
        """The first `need` ids of a long word, exactly as the whole word's, from growing windows of it.

        A window yields the symbols that `_merge` proves final; the next window is twice as long.
        """
        window = _FIRST_WINDOW
        while window < len(word):
            chars = self._symbols(word[: window + self._longest_token])  # the window, then what may follow it
            size = len(self._symbols(word[:window]))
            whole = window + self._longest_token >= len(word)
            merged, final = _merge(list(chars[:size]), self._ranks, functools.partial(self._tokens_at, chars, whole))
            if final >= need:
                return [self._encoder[s] for s in merged[:need]]
            window *= 2
        return list(self._encode_word(word)[:need])

    def _tokens_at(self, chars: str, whole: bool, pos: int) -> list[str]:
        """Every vocabulary token that chars[pos:] starts with; when `whole`, chars ends the word (and so with </w>)."""
        found = []
        for end in range(pos + 1, min(pos + self._longest_token, len(chars)) + 1):
            token = chars[pos:end] + ('</w>' if whole and end == len(chars) else '')
            if token in self._encoder:
                found.append(token)
        return found
