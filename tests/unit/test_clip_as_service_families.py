"""clip-as-service's nine M-CLIP and CN-CLIP names: they resolve, tokenize as the reference packages do
(truncation included), list their facts, and fail clearly offline, without their extra, or with a bad file.
The served parity is in tests/integration/test_clip_as_service_family_flows.py."""

import functools
import sys
import time

import numpy as np
import pytest

from clipserve.backends import BackendOptions, create_backend
from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.catalogue import catalogue
from clipserve.models.families import cnclip, mclip
from clipserve.models.names import parse_model_name
from clipserve.models.registry import resolve
from devkit.model_folders import mclip_folder

from ..compare import relative_error
from ..hub import hub_offline

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')
cn_clip = pytest.importorskip('cn_clip.clip')

NAMES = list(mclip.MODELS) + list(cnclip.MODELS)
TEXTS = [
    'a photo of a cat',
    '一只猫的照片，在草地上。',
    'Café CRÈME brûlée — À LA CARTE!',
    '東京の夜景と北京烤鸭 서울의 밤',
    'emoji 🐶🎉 and © ™ €',
    'control\x00chars\x07 and\ttabs\nnewlines\u200b',
    'x' * 150,  # one word over the tokenizers library's default 100 characters per word
    '',
    '长' * 80,  # over CN-CLIP's 52 tokens
    ' '.join(['a very long caption describing a crowded street at night'] * 12),  # over 77 tokens
]


@pytest.mark.parametrize('name', NAMES)
def test_each_name_resolves_with_its_facts(name):
    resolved = resolve(parse_model_name(name))
    assert str(resolved.name) == name and resolved.family == name.split('/')[0]
    assert resolved.context_length == (77 if name.startswith('M-CLIP') else 52)
    assert resolved.text.causal  # masked towers: padding is trimmed
    if name.startswith('M-CLIP'):
        assert str(resolved.image_model.name) == mclip.MODELS[name].image_model
        assert resolved.preprocess == resolved.image_model.preprocess
    else:
        assert resolved.preprocess.resize_mode == 'squash'
    row = next(r for r in catalogue() if r.name == name)
    assert (row.family, row.embed_dim, row.context_length) == (
        resolved.family,
        resolved.embed_dim,
        resolved.context_length,
    )
    assert row.image_size == resolved.preprocess.image_size and 'onnx' in row.backends


def test_unknown_names_and_random_m_clip_fail_clearly():
    with pytest.raises(UnknownModelError, match='unknown Multilingual-CLIP model .*M-CLIP/LABSE-Vit-L-14'):
        resolve(parse_model_name('M-CLIP/XLM-Roberta-Base'))
    with pytest.raises(UnknownModelError, match='unknown Chinese-CLIP model .*CN-CLIP/RN50'):
        resolve(parse_model_name('CN-CLIP/ViT-B-32'))
    with pytest.raises(UnknownModelError, match='no "::random"'):
        resolve(parse_model_name('M-CLIP/LABSE-Vit-L-14::random'))


def test_cn_clip_tokenizes_exactly_as_cn_clip_does():
    backend_tokenizer = _cn_clip_tokenizer()
    tokens = backend_tokenizer(TEXTS)
    np.testing.assert_array_equal(tokens.input_ids, cn_clip.tokenize(TEXTS, context_length=52).numpy())
    np.testing.assert_array_equal(tokens.attention_mask, tokens.input_ids != 0)


def _cn_clip_tokenizer():
    from clipserve.models.tokenizer_factory import make_tokenizer

    resolved = resolve(parse_model_name('CN-CLIP/RN50::random'))
    return make_tokenizer(resolved.text, cnclip.tokenizer_folder(resolved))


@pytest.fixture(scope='module')
def mclip_files(tmp_path_factory):
    return mclip_folder(tmp_path_factory.mktemp('mclip') / 'XLM-Roberta-Large-Vit-B-32')


def test_m_clip_tokenizes_as_clip_as_service_did(mclip_files):
    """transformers' tokenizer of the same files, as clip-as-service called it: truncated to 77, padded."""
    from clipserve.models.tokenizer_factory import make_tokenizer

    resolved = resolve(parse_model_name(f'M-CLIP/XLM-Roberta-Large-Vit-B-32::{mclip_files}'))
    ours = make_tokenizer(resolved.text, mclip.text_folder(resolved))(TEXTS)
    reference = transformers.AutoTokenizer.from_pretrained(str(mclip_files))
    want = reference(TEXTS, max_length=77, padding='max_length', truncation=True, return_tensors='np')
    np.testing.assert_array_equal(ours.input_ids, want['input_ids'])
    np.testing.assert_array_equal(ours.attention_mask, want['attention_mask'])
    assert ours.input_ids.shape == (len(TEXTS), 77) and ours.attention_mask[-1].all()  # the long one was cut


def test_m_clip_text_tower_equals_multilingual_clip_whatever_shares_the_batch(mclip_files):
    from devkit.model_folders import mclip_reference

    resolved = resolve(parse_model_name(f'M-CLIP/XLM-Roberta-Large-Vit-B-32::{mclip_files}'))
    tower = mclip.build_text_tower(resolved, mclip.text_folder(resolved))
    reference = mclip_reference(mclip_files)
    tokenizer = functools.partial(transformers.AutoTokenizer.from_pretrained(str(mclip_files)), max_length=77)
    with torch.no_grad():
        want = reference.forward(TEXTS, functools.partial(tokenizer, truncation=True)).numpy()
        alone = reference.forward(TEXTS[:1], tokenizer).numpy()
        tokens = tokenizer(TEXTS, padding=True, truncation=True, return_tensors='pt')
        got = tower(tokens['input_ids'], tokens['attention_mask']).numpy()
    assert relative_error(got, want) <= 1e-6
    assert relative_error(got[:1], alone) <= 1e-5  # padding to the batch's longest text changes nothing


@pytest.mark.parametrize('name', NAMES)
def test_offline_without_weights_each_fails_fast_saying_what_to_copy(name, tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'empty-cache'))
    hub_offline(monkeypatch)
    started = time.monotonic()
    with pytest.raises(WeightsUnavailableError) as error:
        create_backend('torch', name, BackendOptions(device='cpu'))
    assert time.monotonic() - started < 30
    message = str(error.value)
    assert 'HF_HUB_OFFLINE' in message and str(tmp_path / 'empty-cache') in message
    assert f'{name}::/path' in message  # how to serve a local copy instead


def test_without_their_extras_the_message_names_the_extra(mclip_files, monkeypatch):
    monkeypatch.setitem(sys.modules, 'cn_clip', None)
    monkeypatch.setitem(sys.modules, 'cn_clip.clip', None)
    with pytest.raises(BackendUnavailableError, match=r'clipserve\[cn-clip\]'):
        create_backend('torch', 'CN-CLIP/RN50::random', BackendOptions(device='cpu'))
    monkeypatch.setitem(sys.modules, 'transformers', None)
    with pytest.raises(BackendUnavailableError, match=r'clipserve\[multilingual\]'):
        resolved = resolve(parse_model_name(f'M-CLIP/XLM-Roberta-Large-Vit-B-32::{mclip_files}'))
        mclip.build_text_tower(resolved, mclip_files)


def test_bad_files_fail_clearly(mclip_files, tmp_path):
    not_a_checkpoint = tmp_path / 'clip_cn_rn50.pt'
    not_a_checkpoint.write_bytes(b'not a checkpoint')
    with pytest.raises(WeightsUnavailableError, match='cannot read the checkpoint'):
        create_backend('torch', f'CN-CLIP/RN50::{not_a_checkpoint}', BackendOptions(device='cpu'))
    wrong_model = tmp_path / 'wrong.pt'
    torch.save({'state_dict': {'module.visual.conv1.weight': torch.zeros(1)}}, wrong_model)
    with pytest.raises(WeightsUnavailableError, match='does not fit CN-CLIP/RN50'):
        create_backend('torch', f'CN-CLIP/RN50::{wrong_model}', BackendOptions(device='cpu'))
    with pytest.raises(WeightsUnavailableError, match='is not an M-CLIP folder'):
        create_backend('torch', f'M-CLIP/LABSE-Vit-L-14::{tmp_path}', BackendOptions(device='cpu'))
