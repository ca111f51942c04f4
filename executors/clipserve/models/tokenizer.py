"""CLIP's text tokenizer without torch, for serving paths (ONNX) that only have numpy.

Token for token equal to open_clip's `SimpleTokenizer` with its default `clean='lower'`: ftfy,
HTML entities unescaped twice, whitespace collapsed, lower-cased, then byte-level BPE over
OpenAI's vocabulary (`bpe_simple_vocab_16e6.txt.gz`, MIT licensed, shipped next to this file).

A request may carry a megabyte of text while CLIP reads only 75 tokens, so long texts are
cleaned and encoded in growing prefixes. A prefix is only used where it provably gives the same
tokens as the whole text:

- ftfy fixes text one segment (line) at a time, and may rewrite a whole segment at once when it
  detects mojibake. A segment is therefore either processed whole by ftfy, or (when none of
  ftfy's rewrites can fire on it, which `_fix_if_simple` checks) by the few local fixes ftfy
  would apply, which may stop anywhere.
- HTML unescaping and whitespace splitting never reach across a space, tab, newline or form
  feed, so the cleaned prefix is cut back to the last of those: every word before it is final.
- BPE runs per word. A word too long to encode whole is encoded from a window, and only the
  symbols that no merge across the window's end could have changed are kept (`_merge`).
"""

from __future__ import annotations

import functools
import gzip
import heapq
import html
import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

import ftfy
import ftfy.badness
import ftfy.chardata
import ftfy.fixes
import numpy as np
import regex

DEFAULT_CONTEXT_LENGTH = 77
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

# Characters after which both html.unescape and str.split start afresh.
_DELIMITERS = ' \t\n\f'


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
    with gzip.open(path, 'rt', encoding='utf-8') as f:
        lines = f.read().split('\n')
    return [tuple(line.split()) for line in lines[1:_NUM_MERGES + 1]]


# --- ftfy, segment by segment --------------------------------------------------------------------

_SEGMENT_LEN = ftfy.TextFixerConfig().max_decode_length  # ftfy also cuts lines longer than this


def _char_class(codes) -> str:
    return ''.join(re.escape(chr(c)) for c in sorted(set(codes)))


# Characters that some ftfy fixer rewrites, other than those `_local_fixes` handles: C1 controls,
# ligatures, full/half-width forms, curly quotes, Unicode line breaks, surrogates, and the
# non-ASCII characters ftfy deletes. '&' starts an HTML entity while ftfy still unescapes them.
_REWRITTEN = (
    _char_class([
        *range(0x80, 0xA0), *ftfy.chardata.LIGATURES, *ftfy.chardata.WIDTH_MAP, 0x02BC, *range(0x2018, 0x2020),
        0x2028, 0x2029, *(c for c in ftfy.chardata.CONTROL_CHARS if c > 0x7F),
    ])
    + '\ud800-\udfff'
)
_REWRITTEN_RE = re.compile(f'[{_REWRITTEN}]')
_REWRITTEN_OR_AMP_RE = re.compile(f'[&{_REWRITTEN}]')
# What `_local_fixes` changes: ASCII controls (ESC starts a terminal escape) and carriage returns.
_LOCAL_RE = re.compile('[\x00-\x08\x0b\x0d-\x1f\x7f]')
# ftfy's mojibake detector; MULTILINE so that `^` also holds at each segment of a multi-line span.
_BADNESS_RE = re.compile(ftfy.badness.BADNESS_RE.pattern, re.VERBOSE | re.MULTILINE)
_BADNESS_WIDTH = 6  # its longest match, in characters (checked by the tests)


def _mojibake_chars(pattern: str) -> set[int]:
    """Every non-ASCII character that ftfy's mojibake pattern names, ranges expanded and \\x escapes decoded.

    Each alternative of the pattern needs one of them (checked by the tests), so text without
    them cannot look like mojibake.
    """
    pattern = re.sub(r'\\x([0-9a-fA-F]{2})', lambda m: chr(int(m.group(1), 16)), pattern)
    codes = {ord(c) for c in pattern if c > '\x7f'}
    for i in range(1, len(pattern) - 1):
        low, high = pattern[i - 1], pattern[i + 1]
        if pattern[i] == '-' and max(low, high) > '\x7f' and low <= high:
            codes.update(range(ord(low), ord(high) + 1))
    return codes


_MOJIBAKE_RE = re.compile(f'[{_char_class(_mojibake_chars(ftfy.badness.BADNESS_RE.pattern))}]')
_MOJIBAKE_ANCHORS = 256  # past this many such characters, one plain search is cheaper


def _looks_bad(text: str) -> bool:
    """`_BADNESS_RE.search(text)`, trying only the starts near a mojibake character while they are rare."""
    untried = 0
    for n, found in enumerate(_MOJIBAKE_RE.finditer(text)):
        if n == _MOJIBAKE_ANCHORS:
            return _BADNESS_RE.search(text, untried) is not None
        end = found.start() + 1
        for start in range(max(untried, end - _BADNESS_WIDTH), end):
            if _BADNESS_RE.match(text, start):
                return True
        untried = end
    return False


def _local_fixes(text: str) -> str:
    """The fixes ftfy applies to text it finds no mojibake in, in ftfy's order."""
    if not _LOCAL_RE.search(text):
        return text
    text = ftfy.fixes.fix_line_breaks(text)
    text = ftfy.fixes.remove_terminal_escapes(text)
    return ftfy.fixes.remove_control_chars(text)


def _fix_if_simple(span: str, amp_ok: bool) -> str | None:
    """`ftfy.fix_text(span)` when it provably reduces to `_local_fixes`, else None.

    `span` is whole ftfy segments. ftfy then leaves it alone apart from the local fixes, as long
    as no fixer has anything to rewrite, the result is NFC, and the mojibake detector fires
    neither before nor after. Unlike ftfy's own output, these fixes can stop anywhere.
    """
    if (_REWRITTEN_RE if amp_ok else _REWRITTEN_OR_AMP_RE).search(span):
        return None
    fixed = _local_fixes(span)
    if span.isascii():  # always NFC, and every mojibake pattern needs a non-ASCII character
        return fixed
    if not unicodedata.is_normalized('NFC', fixed) or _looks_bad(span):
        return None
    if fixed is not span and _looks_bad(fixed):
        return None
    return fixed


def _segment_start(text: str, pos: int) -> int:
    """Start of the ftfy segment that holds text[pos]."""
    line = text.rfind('\n', 0, pos) + 1
    return line + (pos - line) // _SEGMENT_LEN * _SEGMENT_LEN


def _segment_end(text: str, start: int) -> int:
    """End of the ftfy segment that starts at `start`."""
    newline = text.find('\n', start)
    end = len(text) if newline < 0 else newline + 1
    return min(end, start + _SEGMENT_LEN)


def _middle_boundary(text: str, start: int, end: int) -> int:
    """A segment boundary strictly inside text[start:end], which holds more than one segment."""
    middle = (start + end) // 2
    newline = text.find('\n', middle, end - 1)
    if newline < 0:
        newline = text.rfind('\n', start, middle)
    return newline + 1 if newline >= 0 else start + _SEGMENT_LEN


def _fix_span(text: str, start: int, end: int, first_lt: int, out: list[str]) -> None:
    """Append ftfy.fix_text's output for text[start:end], a run of whole segments, to `out`.

    Runs ftfy itself only on the segments that need it, found by halving; ftfy stops unescaping
    HTML from the segment that holds the first '<' on (`first_lt`).
    """
    if end - start <= _SEGMENT_LEN:
        fixed = _fix_if_simple(text[start:end], amp_ok=0 <= first_lt < start)
        if fixed is not None:
            out.append(fixed)
            return
        if _segment_end(text, start) == end:
            unescape = first_lt < 0 or first_lt >= end
            out.append(ftfy.fix_text(text[start:end]) if unescape else ftfy.fix_text(text[start:end], unescape_html=False))
            return
    middle = _middle_boundary(text, start, end)
    _fix_span(text, start, middle, first_lt, out)
    _fix_span(text, middle, end, first_lt, out)


def _last_blank(text: str, start: int, stop: int) -> int:
    """Index just past the last space, tab or form feed in text[start:stop], or `start`."""
    return max(text.rfind(c, start, stop) for c in ' \t\f') + 1 or start


def _next_delimiter(text: str, pos: int) -> int:
    """Index just past the first space, tab, newline or form feed at or after `pos`, or len(text)."""
    found = [i for i in (text.find(c, pos) for c in _DELIMITERS) if i >= 0]
    return min(found) + 1 if found else len(text)


def _clean_words(fixed: str) -> str:
    """open_clip's clean='lower' applied to ftfy's output."""
    text = html.unescape(html.unescape(fixed))
    return ' '.join(text.split()).lower()


def clean_text(text: str) -> str:
    """open_clip's clean='lower' (ftfy, unescape HTML twice, collapse whitespace, lower-case)."""
    out: list[str] = []
    _fix_span(text, 0, len(text), text.find('<'), out)
    return _clean_words(''.join(out))


class _CleanStream:
    """open_clip's clean='lower' text of one input, a run of whole words at a time.

    Raw text is consumed up to `pos`, always a point where ftfy's output may be cut: a segment
    boundary, or just past a space/tab/form feed inside a simple segment (ending at `simple_end`).
    Fixed text after the last delimiter (`carry`) may be the start of a longer word, so it waits.
    """

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.simple_end = 0
        self.first_lt = text.find('<')
        self.carry = ''

    @property
    def finished(self) -> bool:
        return self.pos >= len(self.text)

    def next_words(self, size: int) -> str:
        """Cleaned whole words from about `size` more raw characters; everything left at the end."""
        fixed = self._fix_until(_next_delimiter(self.text, self.pos + size))
        if self.finished:
            words, self.carry = self.carry + fixed, ''
            return _clean_words(words)
        last = max(fixed.rfind(c) for c in _DELIMITERS) + 1
        if not last:
            self.carry += fixed
            return ''
        words, self.carry = self.carry + fixed[:last], fixed[last:]
        return _clean_words(words)

    def _fix_until(self, stop: int) -> str:
        """ftfy's output from `pos` to the last cut point at or before `stop` (or past it, to a segment's end)."""
        text, pos, out = self.text, self.pos, []
        if pos < self.simple_end:  # inside a simple segment: its local fixes may stop at any blank
            if stop < self.simple_end:
                self.pos = _last_blank(text, pos, stop)
                return _local_fixes(text[pos:self.pos])
            out.append(_local_fixes(text[pos:self.simple_end]))
            pos = self.simple_end
        if pos < stop:
            start = _segment_start(text, stop - 1)
            end = _segment_end(text, start)
            if end == stop:
                start = end
            _fix_span(text, pos, start, self.first_lt, out)
            pos = start
            if pos < stop:  # stop falls inside the segment [start, end)
                if _fix_if_simple(text[start:end], amp_ok=0 <= self.first_lt < start) is None:
                    _fix_span(text, start, end, self.first_lt, out)
                    pos = end
                else:
                    self.simple_end = end
                    pos = _last_blank(text, start, stop)
                    out.append(_local_fixes(text[start:pos]))
        self.pos = pos
        return ''.join(out)


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

    input_ids: np.ndarray  # int64 [B, context_length]: <sot> tokens <eot>, zero padded
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
            input_ids[row, :len(ids)] = ids
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
        stream = _CleanStream(text)
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
        """The first `need` ids of a long word, from growing windows of it; exact as the whole word's.

        A window yields the symbols `_merge` proves final; the next window is twice as long.
        """
        window = _FIRST_WINDOW
        while window < len(word):
            chars = self._symbols(word[:window + self._longest_token])  # the window plus what may follow it
            size = len(self._symbols(word[:window]))
            whole = window + self._longest_token >= len(word)

            def next_tokens(pos: int) -> list[str]:
                found = []
                for length in range(1, self._longest_token + 1):
                    token = chars[pos:pos + length]
                    if len(token) < length:
                        break
                    if whole and pos + length == len(chars):
                        token += '</w>'
                    if token in self._encoder:
                        found.append(token)
                return found

            merged, final = _merge(list(chars[:size]), self._ranks, next_tokens)
            if final >= need:
                return [self._encoder[s] for s in merged[:need]]
            window *= 2
        return list(self._encode_word(word)[:need])
