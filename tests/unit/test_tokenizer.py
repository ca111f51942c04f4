"""The torch-free tokenizer must give exactly open_clip's tokens, fast, for any str."""

import random
import subprocess
import sys

import ftfy
import numpy as np
import pytest

from clipserve.models import tokenizer as tk
from clipserve.models.tokenizer import DEFAULT_CONTEXT_LENGTH, TokenBatch, Tokenizer

from .standalone_imports import third_party_imports
from .texts import random_text

open_clip = pytest.importorskip('open_clip')


@pytest.fixture(scope='module')
def ours():
    return Tokenizer()


@pytest.fixture(scope='module')
def ref():
    return open_clip.get_tokenizer('ViT-B-32')


def assert_same(ours, ref, texts, context_length=DEFAULT_CONTEXT_LENGTH):
    expected = ref(texts, context_length=context_length).numpy()
    got = ours(texts).input_ids
    assert got.dtype == np.int64
    assert got.shape == expected.shape
    for row, text in enumerate(texts):
        assert got[row].tolist() == expected[row].tolist(), repr(text[:80])


VARIED = [
    'a photo of a cat',
    'A Photo Of A CAT sitting on the MAT.',
    'Hello, world!!! What?! (yes) [no] {maybe} -- "quoted" \'single\' ... #tag @user',
    "it's, don't, we're, they've, I'm, you'll, he'd, IT'S",
    '3.14159 is pi; 1,000,000 people; 2024-01-01; 12:30pm; 0x1F; 1e10',
    'Tom &amp; Jerry &lt;3 &quot;quoted&quot; &#39;x&#39; &#x263A; &amp;amp; &nbsp;space &copy; &eacute;',
    '<b>bold</b> &amp; <i>it</i>',  # a '<' turns ftfy's own HTML unescaping off
    'café naïve résumé Ångström façade coöperate Straße ÉCOLE',
    'Ã©tÃ© Ã  la plage â€” mojibake, and âœ” ok',
    '一张猫的照片 東京タワー 서울의 밤 ภาษาไทย مرحبا שלום',
    '😀😃😄😁🐱🎉🎉🎉👍🏽👨‍👩‍👧‍👦🇺🇸❤️',
    '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0e\x0f\x10\x1b\x7f',
    '',
    '   \t\n\r\n  \x0c \u3000\xa0 ',
    "ΟΔΟΣ ΣΑΣ Σ. İstanbul ǅ ſtraße it'ſ",
    'ﬁne ﬂow ＡＢＣ１２３ “curly” ‘quotes’ ′prime′',
    'red\x1b[31m text\x1b[0m and\r\nCRLF\rCR\u2028LS\u2029PS\x85NEL',
    'e\u0301 vs é, A\u030a vs Å, \ufeffBOM \u200bzero width\u200d',
    'lone surrogates \ud83d and \ude00 and a pair \ud83d\ude00',
    'the <start_of_text> and <END_OF_TEXT> markers <start_of_text>',
    'Supercalifragilisticexpialidocious ' * 3 + 'x' * 300 + ' ' + '!' * 200,
    '😂' * 600,
    'a' * 2000,
]


def test_varied_texts_match_open_clip(ours, ref):
    assert_same(ours, ref, VARIED)


def test_encode_without_a_limit_matches_open_clip(ours, ref):
    for text in VARIED:
        assert ours.encode(text) == ref.encode(text), repr(text[:80])


@pytest.mark.parametrize('words', [74, 75, 76, 77, 200])
def test_truncation_boundary(ours, ref, words):
    text = ' '.join(['a'] * words)  # one token per word
    assert_same(ours, ref, [text])
    batch = ours(text)
    ids = batch.input_ids[0]
    assert batch.lengths[0] == min(words + 2, DEFAULT_CONTEXT_LENGTH)
    assert ids[batch.lengths[0] - 1] == ours.eot_token_id
    assert ids[0] == ours.sot_token_id


def test_other_context_lengths(ref):
    texts = VARIED[:6] + [' '.join(['word'] * 40)]
    for context_length in (2, 3, 16, 77, 100):
        assert_same(Tokenizer(context_length=context_length), ref, texts, context_length=context_length)
    with pytest.raises(ValueError):
        Tokenizer(context_length=1)


def test_batch_shape_mask_lengths_and_dtypes(ours):
    batch = ours(['a photo of a cat', '', 'x ' * 500])
    assert isinstance(batch, TokenBatch)
    for array in (batch.input_ids, batch.attention_mask, batch.lengths):
        assert array.dtype == np.int64
    assert batch.input_ids.shape == batch.attention_mask.shape == (3, DEFAULT_CONTEXT_LENGTH)
    assert batch.lengths.tolist() == [7, 2, DEFAULT_CONTEXT_LENGTH]
    assert (batch.attention_mask.sum(axis=1) == batch.lengths).all()
    for row, length in enumerate(batch.lengths):
        assert batch.attention_mask[row, :length].all() and not batch.attention_mask[row, length:].any()
        assert (batch.input_ids[row, length:] == 0).all() and (batch.input_ids[row, :length] != 0).all()
        assert batch.input_ids[row, length - 1] == ours.eot_token_id


def test_single_str_is_a_batch_of_one(ours):
    one = ours('a photo of a cat')
    assert one.input_ids.shape == (1, DEFAULT_CONTEXT_LENGTH)
    assert one.input_ids.tolist() == ours(['a photo of a cat']).input_ids.tolist()
    assert ours([]).input_ids.shape == (0, DEFAULT_CONTEXT_LENGTH)


def test_vocabulary_and_special_tokens(ours, ref):
    assert ours.vocab_size == ref.vocab_size == 49408
    assert (ours.sot_token_id, ours.eot_token_id) == (ref.sot_token_id, ref.eot_token_id)
    assert ours.context_length == DEFAULT_CONTEXT_LENGTH


def test_non_str_is_a_type_error(ours):
    with pytest.raises(TypeError):
        ours.encode(b'bytes')
    with pytest.raises(TypeError):
        ours(['ok', None])


def test_bpe_cache_is_bounded(ours):
    info = ours._word_ids.cache_info()
    assert info.maxsize is not None and 0 < info.maxsize <= 1 << 16
    rng = random.Random(0)
    ours(' '.join(''.join(rng.choice('abcdefghij') for _ in range(8)) for _ in range(2000)))
    assert ours._word_ids.cache_info().currsize <= info.maxsize


# --- long and pathological texts --------------------------------------------------------------------


def _one_megabyte_of_words(seed=0):
    rng = random.Random(seed)
    words = "a photo of the cat dog sitting on red blue chair table Hello World café 東京 &amp; it's 42".split()
    return ' '.join(rng.choice(words) for _ in range(250_000))[:1_000_000]


def test_one_megabyte_text_matches_open_clip(ours, ref):
    text = _one_megabyte_of_words()
    assert len(text) == 1_000_000
    assert_same(ours, ref, [text])


def test_long_texts_are_not_fixed_whole(ours, monkeypatch):
    """ftfy (the slow part) only ever sees the first lines it needs, however long the text."""
    seen = []
    real_fix_text = ftfy.fix_text

    def spy(text, *args, **kwargs):
        seen.append(len(text))
        return real_fix_text(text, *args, **kwargs)

    monkeypatch.setattr(ftfy, 'fix_text', spy)
    ours(_one_megabyte_of_words())  # one line, nothing for ftfy to do
    assert seen == []
    lines = '\n'.join(f'line {i}: caf&eacute; Ã©tÃ© “quoted” ﬁne' for i in range(30_000))  # ftfy on every line
    ours(lines)
    assert 0 < sum(seen) < 20_000


PATHOLOGICAL = {
    'whitespace': ' \t\n\r\f\v\xa0\u3000' * 131_072,
    'newlines': '\n' * 1_048_576,
    'control characters': ''.join(map(chr, range(32))) * 32_768,
    'one emoji': '😂' * 262_144,
    'emoji mix': ''.join(chr(0x1F600 + i % 80) for i in range(262_144)),
    'cjk, no spaces': ''.join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(1_048_576)),
    'one letter': 'a' * 1_048_576,
    'dashes': '-' * 1_048_576,
    'accented line': ('Le café était très élevé à l’été, où garçons et élèves ' * 20_000)[:1_048_576],
    'cyrillic line': ('Привет мир, это «тест» ' * 50_000)[:1_048_576],
    'entities': 'Tom &amp; Jerry ' * 65_536,
    'crlf': 'x\r\n' * 349_525,
}


@pytest.mark.parametrize('name', PATHOLOGICAL)
def test_pathological_megabytes_never_fail(ours, name):
    batch = ours(PATHOLOGICAL[name])
    assert batch.input_ids[0, 0] == ours.sot_token_id
    assert batch.input_ids[0, batch.lengths[0] - 1] == ours.eot_token_id


def test_texts_without_tokens(ours):
    for name in ('whitespace', 'newlines', 'control characters'):
        assert ours(PATHOLOGICAL[name]).lengths.tolist() == [2]


@pytest.mark.parametrize(
    'text',
    [
        PATHOLOGICAL['control characters'],
        PATHOLOGICAL['one emoji'],
        'a' * 200_000,
        ''.join(chr(0x1F600 + (i * 31) % 80) for i in range(3000)),
        ''.join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(3000)),
        '\n'.join(['', 'x < y', 'caf&eacute; &amp;amp;'] * 3000),  # ftfy stops unescaping after the first '<'
        '\n'.join(['caf&eacute; &amp;amp;'] * 3000 + ['x < y']),
        ' '.join(['Ã©tÃ©'] * 5000) + '\n' + 'plain text ' * 1000,  # mojibake: ftfy fixes the whole line
        ('word ' * 3000) + 'Ã©tÃ©',  # mojibake at the far end of the line changes ftfy's view of it all
    ],
    ids=['controls', 'emoji', 'letters', 'emoji-mix', 'cjk', 'lt-first', 'lt-last', 'mojibake', 'mojibake-at-end'],
)
def test_long_texts_match_open_clip(ours, ref, text):
    assert_same(ours, ref, [text])


# --- the pieces the prefix processing rests on ----------------------------------------------------


def test_prefixes_and_windows_match_the_whole_text(ours, ref, monkeypatch):
    """With tiny prefixes and windows, every cut the tokenizer makes is exercised on short texts."""
    monkeypatch.setattr(tk, '_FIRST_PREFIX', 8)
    monkeypatch.setattr(tk, '_LONG_WORD', 6)
    monkeypatch.setattr(tk, '_FIRST_WINDOW', 3)
    rng = random.Random(2)
    runs = ['a', 'ab', '😂', '-', '一', 'aab', '😂😍', '!', 'xyzzy', 'é', 'ing']
    texts = [random_text(rng, rng.randint(0, 150)) for _ in range(400)]
    texts += [rng.choice(runs) * rng.randint(1, 200) for _ in range(100)]
    texts += [''.join(rng.choice(runs) for _ in range(rng.randint(1, 150))) for _ in range(100)]
    for text in texts:
        expected = ref.encode(text)
        for limit in (1, 4, 20, 75):
            assert ours.encode(text, max_tokens=limit) == expected[:limit], (limit, repr(text[:80]))


def test_bpe_matches_open_clip_on_random_words(ours, ref):
    rng = random.Random(3)
    alphabet = 'aeiouxyzqst' + 'éüß' + '一猫' + '😂😀' + "-!.'"
    for _ in range(1500):
        word = ''.join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        symbols = ours._symbols(word)
        expected = [ref.encoder[token] for token in ref.bpe(symbols).split(' ')]
        assert list(ours._encode_word(word)) == expected, word


def test_merges_only_make_pairs_of_higher_rank(ours):
    """The heap-ordered BPE equals open_clip's only if each merge's parts exist before it."""
    made = {}
    for (left, right), rank in ours._ranks.items():
        for part in (left, right):
            assert len(part.removesuffix('</w>')) == 1 or made.get(part, rank) < rank, (left, right)
        made.setdefault(left + right, rank)


# --- imports ------------------------------------------------------------------------------------------


def test_importing_the_tokenizer_does_not_import_torch():
    code = "import sys, clipserve.models.tokenizer; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, '-c', code], check=True, timeout=120)


def test_the_module_alone_needs_only_numpy_regex_and_ftfy():
    """The tokenizer (and the text cleaning it uses) without the package root."""
    check = 'assert module.Tokenizer()("a photo of a cat").lengths.tolist() == [7]'
    assert third_party_imports('clipserve.models.tokenizer', check) <= {'numpy', 'regex', 'ftfy', 'wcwidth'}
