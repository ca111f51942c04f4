"""open_clip's `clean='lower'` text cleaning (ftfy, HTML unescaped twice, whitespace collapsed, lower
case), whole (`clean_text`) or a run of whole words at a time (`CleanStream`) for texts far longer than
a model reads.

A prefix is only used where it provably gives the same text as cleaning the whole input:

- ftfy fixes text one segment (line) at a time, and may rewrite a whole segment at once when it
  detects mojibake. A segment is therefore either fixed whole by ftfy, or, when ftfy provably
  finds no mojibake in it (`_fix_if_simple`), by the character-local fixes ftfy would apply
  (HTML entities, ligatures, widths, quotes, line breaks, controls), which may stop at any blank.
- HTML unescaping and whitespace splitting never reach across a space, tab, newline or form
  feed, so the cleaned prefix is cut back to the last of those: every word before it is final.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Iterable, Sequence

import ftfy
import ftfy.badness
import ftfy.chardata
import ftfy.fixes

# Characters after which both html.unescape and str.split start afresh.
_DELIMITERS = ' \t\n\f'

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


class CleanStream:
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
