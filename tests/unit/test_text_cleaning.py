"""models/text_cleaning.py (the cleaning before BPE: ftfy, HTML unescaping, whitespace) gives open_clip's
cleaned text for any str, including where ftfy cuts long lines, and its shortcuts skip only what they may."""

import html
import random
import re

import ftfy
import pytest

from clipserve.models import text_cleaning

from .texts import random_text


def _reference_clean(text, **ftfy_options):
    text = html.unescape(html.unescape(ftfy.fix_text(text, **ftfy_options))).strip()
    return ' '.join(text.split()).strip().lower()


def test_cleaning_matches_open_clip_onrandom_text():
    rng = random.Random(1)
    for _ in range(600):
        text = random_text(rng, rng.randint(0, 60))
        assert text_cleaning.clean_text(text) == _reference_clean(text), repr(text)


@pytest.mark.parametrize('segment', [5, 17])
def test_cleaning_follows_ftfys_cut_of_long_lines(monkeypatch, segment):
    """ftfy cuts lines longer than max_decode_length; shrink it on both sides to see that we cut alike."""
    monkeypatch.setattr(text_cleaning, '_SEGMENT_LEN', segment)
    rng = random.Random(segment)
    for _ in range(300):
        text = random_text(rng, rng.randint(0, 60))
        assert text_cleaning.clean_text(text) == _reference_clean(text, max_decode_length=segment), repr(text)


def test_local_fixers_change_only_the_characters_said():
    """`_local_fixes` is skipped on text without a `_LOCAL_RE` character: none of its fixers may then act."""
    untouched = ''.join(
        chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000 and not text_cleaning._LOCAL_RE.match(chr(c))
    )
    for fix in text_cleaning._LOCAL_FIXERS:
        assert fix(untouched) == untouched, fix.__name__


def test_mojibake_anchors_cover_every_pattern():
    """`_looks_bad` only tries starts within _BADNESS_WIDTH before an anchor: each alternative must need one."""
    try:
        from re import _constants as constants
        from re import _parser as parser
    except ImportError:  # Python 3.10
        import sre_constants as constants
        import sre_parse as parser

    def closed_set(op, arg):
        if op is constants.LITERAL:
            return {arg}
        if op is constants.IN and all(o in (constants.LITERAL, constants.RANGE) for o, _ in arg):
            return {c for o, a in arg for c in ([a] if o is constants.LITERAL else range(a[0], a[1] + 1))}
        return None

    (anchors,) = parser.parse(text_cleaning._MOJIBAKE_RE.pattern).data
    anchor_chars = closed_set(*anchors)
    tree = parser.parse(text_cleaning._BADNESS_RE.pattern, re.VERBOSE)
    assert tree.getwidth()[1] <= text_cleaning._BADNESS_WIDTH
    ((op, (_, branches)),) = tree.data
    assert op is constants.BRANCH and len(branches) > 30
    for branch in branches:
        assert any((chars := closed_set(o, a)) and chars <= anchor_chars for o, a in branch.data), branch.data
