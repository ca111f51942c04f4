"""CLIP's text tokenizer without torch, for serving paths (ONNX) that only have numpy.

Token for token equal to open_clip's `SimpleTokenizer` with its default `clean='lower'`: ftfy,
HTML entities unescaped twice, whitespace collapsed, lower-cased, then byte-level BPE over
OpenAI's vocabulary (`bpe_simple_vocab_16e6.txt.gz`, MIT licensed, shipped next to this file).

A request may carry a megabyte of text while CLIP reads only 75 tokens, so long texts are
cleaned and encoded in growing prefixes. A prefix is only used where it provably gives the same
tokens as the whole text:

- ftfy fixes text one segment (line) at a time, and may rewrite a whole segment at once when it
  detects mojibake. A segment is therefore either fixed whole by ftfy, or, when ftfy provably
  finds no mojibake in it (`_fix_if_simple`), by the character-local fixes ftfy would apply
  (HTML entities, ligatures, widths, quotes, line breaks, controls), which may stop at any blank.
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
from typing import Callable, Iterable, Sequence

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
    """The merges CLIP uses, best first (the file's first line is a header)."""
    with gzip.open(path, 'rt', encoding='utf-8') as f:
        lines = f.read().split('\n')
    return [tuple(line.split()) for line in lines[1 : _NUM_MERGES + 1]]


# --- ftfy, segment by segment --------------------------------------------------------------------

_SEGMENT_LEN = ftfy.TextFixerConfig().max_decode_length  # ftfy also cuts lines longer than this


def _char_class(codes: Iterable[int]) -> str:
    """The inside of a regex character class that matches exactly these code points."""
    return ''.join(re.escape(chr(c)) for c in sorted(set(codes)))


# The fixers ftfy applies a character (or escape sequence) at a time, in ftfy's order, after
# unescaping HTML entities (just as local). When it sees no mojibake, they are all it does, and
# unlike ftfy as a whole, they can stop at any blank.
_LOCAL_FIXERS = (
    ftfy.fixes.fix_latin_ligatures,
    ftfy.fixes.fix_character_width,
    ftfy.fixes.uncurl_quotes,
    ftfy.fixes.fix_line_breaks,
    ftfy.fixes.fix_surrogates,
    ftfy.fixes.remove_terminal_escapes,
    ftfy.fixes.remove_control_chars,
)
# The characters they change (ESC starts a terminal escape); checked by the tests.
_LOCAL_RE = re.compile(
    '[%s\ud800-\udfff]'
    % _char_class(
        [
            *ftfy.chardata.LIGATURES,
            *ftfy.chardata.WIDTH_MAP,
            0x02BC,
            *range(0x2018, 0x2020),
            0x0D,
            0x85,
            0x2028,
            0x2029,
            0x1B,
            *ftfy.chardata.CONTROL_CHARS,
        ]
    )
)
# ftfy's mojibake detector; MULTILINE so that `^` also holds at each segment of a multi-line span.
_BADNESS_RE = re.compile(ftfy.badness.BADNESS_RE.pattern, re.VERBOSE | re.MULTILINE)
_BADNESS_WIDTH = 7  # its longest match, in characters (checked by the tests)


def _category_chars(names: Sequence[str]) -> set[int]:
    """The characters of some of ftfy's mojibake categories (strings of characters and a-b ranges)."""
    codes: set[int] = set()
    for name in names:
        chars = ftfy.badness.MOJIBAKE_CATEGORIES[name]
        i = 0
        while i < len(chars):
            if i + 2 < len(chars) and chars[i + 1] == '-':
                codes.update(range(ord(chars[i]), ord(chars[i + 2]) + 1))
                i += 3
            else:
                codes.add(ord(chars[i]))
                i += 1
    return codes


# Every alternative of the mojibake pattern needs one of these (checked by the tests), so the
# search can start near them only; plain accented, Greek or Cyrillic text has few of them.
_MOJIBAKE_RE = re.compile(
    '[%s]'
    % _char_class(
        _category_chars(
            ['c1', 'bad', 'law', 'currency', 'start_punctuation', 'end_punctuation', 'numeric', 'box', 'upper_accented']
        )
        | {ord(c) for c in 'œÙЂ°'}
    )
)
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


def _local_fixes(text: str, unescape: bool) -> str:
    """What ftfy does to text with no mojibake; `unescape`: whether it still unescapes HTML here."""
    if unescape and '&' in text:
        text = ftfy.fixes.unescape_html(text)
    if _LOCAL_RE.search(text):
        for fix in _LOCAL_FIXERS:
            text = fix(text)
    return text


def _fix_if_simple(span: str, unescape: bool) -> str | None:
    """`ftfy.fix_text(span)` when it provably amounts to `_local_fixes`, else None.

    `span` is whole ftfy segments. ftfy loops over its fixers until nothing changes: here the
    first round finds no mojibake after unescaping, and a second round would change nothing.
    Every mojibake pattern needs a non-ASCII character, so ASCII text never looks like it.
    """
    text = ftfy.fixes.unescape_html(span) if unescape and '&' in span else span
    if not text.isascii() and _looks_bad(text):
        return None
    fixed = _local_fixes(text, unescape=False)
    if fixed is not span:
        if unescape and '&' in fixed and ftfy.fixes.unescape_html(fixed) != fixed:
            return None
        if _LOCAL_RE.search(fixed) or fixed is not text and not fixed.isascii() and _looks_bad(fixed):
            return None
    if not fixed.isascii() and not unicodedata.is_normalized('NFC', fixed):
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

    Runs ftfy itself only on the segments that need it, found by halving. ftfy unescapes HTML
    in the segments before the one that holds the first '<' (`first_lt`; len(text) if none).
    """
    if end - start <= _SEGMENT_LEN:
        single = _segment_end(text, start) == end
        if first_lt >= end:
            unescape = True
        elif first_lt < start or single:
            unescape = False
        else:
            unescape = None  # ftfy unescapes the segments before the first '<', not those after
        if unescape is not None:
            fixed = _fix_if_simple(text[start:end], unescape)
            if fixed is not None:
                out.append(fixed)
                return
            if single:
                options = {} if unescape else {'unescape_html': False}
                out.append(ftfy.fix_text(text[start:end], **options))
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
    _fix_span(text, 0, len(text), _first_lt(text), out)
    return _clean_words(''.join(out))


def _first_lt(text: str) -> int:
    """Where the first '<' is (ftfy stops unescaping HTML from its segment on), or len(text)."""
    position = text.find('<')
    return len(text) if position < 0 else position


class _CleanStream:
    """open_clip's clean='lower' text of one input, a run of whole words at a time.

    Raw text is consumed up to `pos`, always a point where ftfy's output may be cut: a segment
    boundary, or just past a space/tab/form feed inside a simple segment (ending at `simple_end`).
    Fixed text after the last delimiter (`carry`) may be the start of a longer word, so it waits;
    so does fixed text beyond what was asked for (`pending`, starting at a word boundary).
    """

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.simple_end = 0
        self.first_lt = _first_lt(text)
        self.unescape = False  # whether ftfy unescapes HTML in the simple segment
        self.carry = ''
        self.pending = ''

    @property
    def finished(self) -> bool:
        return self.pos >= len(self.text) and not self.pending

    def next_words(self, size: int) -> str:
        """Cleaned whole words from about `size` more characters; everything left at the end."""
        if self.pending:
            fixed, self.pending = self.pending, ''
        else:
            fixed = self._fix_until(_next_delimiter(self.text, self.pos + size))
        if len(fixed) > 2 * size:  # a segment ftfy had to fix whole: clean only what was asked for
            cut = _next_delimiter(fixed, size)
            fixed, self.pending = fixed[:cut], fixed[cut:]
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
        if pos < self.simple_end:  # inside a simple segment: its fixes may stop at any blank
            if stop < self.simple_end:
                self.pos = _last_blank(text, pos, stop)
                return _local_fixes(text[pos : self.pos], self.unescape)
            out.append(_local_fixes(text[pos : self.simple_end], self.unescape))
            pos = self.simple_end
        if pos < stop:
            start = _segment_start(text, stop - 1)
            end = _segment_end(text, start)
            if end == stop:
                start = end
            _fix_span(text, pos, start, self.first_lt, out)
            pos = start
            if pos < stop:  # stop falls inside the segment [start, end)
                unescape = self.first_lt >= end
                if _fix_if_simple(text[start:end], unescape) is None:
                    _fix_span(text, start, end, self.first_lt, out)
                    pos = end
                else:
                    self.simple_end, self.unescape = end, unescape
                    pos = _last_blank(text, start, stop)
                    out.append(_local_fixes(text[start:pos], unescape))
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
