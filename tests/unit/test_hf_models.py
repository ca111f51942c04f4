"""Models whose text side is a Hugging Face tokenizer (SigLIP here): clipserve's torch-free tokenizer and
its backends against open_clip's own tokenizer (through transformers), model and preprocessing, on a
local-dir folder the tests build (shrunk config, random weights, a tokenizer trained here)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from clipserve.backends import BackendOptions, create_backend
from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import preprocess_image
from clipserve.models.registry import resolve
from clipserve.models.tokenizer_factory import make_tokenizer
from devkit.model_folders import siglip_dir

from ..compare import relative_error
from ..hub import hub_offline

open_clip = pytest.importorskip('open_clip')
pytest.importorskip('transformers')  # open_clip's HFTokenizer, the reference
torch = pytest.importorskip('torch')

TEXTS = [
    'a photo of a cat',
    'Café CRÈME brûlée — à la carte!',
    '東京の夜景と北京烤鸭',
    'emoji 🐶🎉 and © ™',
    'control\x00chars\x07 and\ttabs\nnewlines',
    'an underscore_joined_phrase, with "punctuation"; (and) [brackets]',
    '&amp;lt;html&amp;gt; entities &quot;twice&quot;',
    '',
    ' '.join(['a very long caption describing a crowded street at night'] * 12),  # over the context
]


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    """SigLIP-style (Unigram, pad = </s>, canonicalize) and CLIPA-style (WordPiece, strip [SEP]) folders."""
    root = tmp_path_factory.mktemp('hf-models')
    return {
        'siglip': siglip_dir(root / 'siglip'),
        'wordpiece': siglip_dir(root / 'wordpiece', 'wordpiece', {'clean': 'whitespace', 'strip_sep_token': True}),
    }


def reference(folder):
    name = f'local-dir:{folder}'
    model, _, preprocess = open_clip.create_model_and_transforms(name)
    return model.eval(), preprocess, open_clip.get_tokenizer(name)


@pytest.mark.parametrize('kind', ['siglip', 'wordpiece'])
def test_token_ids_equal_open_clips_on_the_same_files(folders, kind):
    folder = folders[kind]
    resolved = resolve(parse_model_name(f'local-dir:{folder}'))
    ours = make_tokenizer(resolved.text, folder)
    _, _, theirs = reference(folder)
    want = theirs(TEXTS).numpy()
    got = ours(TEXTS)
    assert got.input_ids.dtype == np.int64 and got.input_ids.shape == want.shape == (len(TEXTS), 16)
    for row, text in enumerate(TEXTS):
        assert got.input_ids[row].tolist() == want[row].tolist(), repr(text[:60])
    assert got.lengths.tolist() == got.attention_mask.sum(axis=1).tolist()


def test_the_text_facts_come_from_the_config(folders):
    text = resolve(parse_model_name(f'local-dir:{folders["siglip"]}')).text
    assert text.tokenizer == 'hf-tokenizers' and text.context_length == 16 and text.clean == 'canonicalize'
    assert not text.causal  # no causal mask, last-token pooling: never trimmed
    builtin = resolve(parse_model_name('ViT-B-16-SigLIP::webli')).text
    assert builtin.hf_tokenizer_name == 'timm/ViT-B-16-SigLIP' and builtin.context_length == 64
    assert resolve(parse_model_name('PE-Core-B-16::meta')).text.context_length == 32
    assert resolve(parse_model_name('ViT-B-32::openai')).text.causal


def _image(seed, size=(300, 200)):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


# family -> (context length, padding trimmed, pad id)
EXPECTED = {
    'siglip': (16, False, 1),
    'siglip2': (16, False, 0),
    'metaclip2': (16, True, 1),
    'xlmr': (77, False, 1),
    'clipa': (16, False, 0),
    'pecore': (32, True, 0),
    'mobileclip2': (77, False, 0),
}


@pytest.mark.parametrize('family', list(EXPECTED))
def test_torch_backend_equals_open_clip(family_folder, family):
    folder = family_folder(family)
    backend = create_backend('torch', f'local-dir:{folder}', BackendOptions(device='cpu'))
    model, preprocess, tokenizer = reference(folder)
    context, trims, pad_id = EXPECTED[family]
    assert (backend.context_length, backend.trims_padding, backend.pad_id) == (context, trims, pad_id)
    tokens = backend.tokenizer(TEXTS)
    want_tokens = tokenizer(TEXTS).numpy()
    assert tokens.input_ids.tolist() == want_tokens.tolist()
    got = backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    with torch.no_grad():
        want = model.encode_text(torch.from_numpy(want_tokens)).numpy()
    assert relative_error(got, want) <= 1e-5
    images = [_image(1), _image(2, (64, 500))]
    pixels = np.stack([preprocess_image(im, backend.preprocess) for im in images])
    with torch.no_grad():
        want_pixels = torch.stack([preprocess(im) for im in images])
        want = model.encode_image(want_pixels).numpy()
    assert np.abs(pixels - want_pixels.numpy()).max() <= 1e-5
    assert relative_error(backend.encode_images(pixels), want) <= 1e-5


def test_siglip_preprocessing_and_sigmoid_logits(folders):
    backend = create_backend('torch', f'local-dir:{folders["siglip"]}', BackendOptions(device='cpu'))
    assert backend.preprocess.resize_mode == 'squash' and backend.preprocess.mean == (0.5, 0.5, 0.5)
    scale, bias = backend.sigmoid_logits
    model, _, _ = reference(folders['siglip'])
    assert scale == pytest.approx(float(model.logit_scale.exp())) and bias == pytest.approx(float(model.logit_bias))
    plain = create_backend('torch', f'local-dir:{folders["wordpiece"]}', BackendOptions(device='cpu'))
    assert plain.sigmoid_logits is not None  # a SigLIP config either way (init_logit_bias)


@pytest.mark.parametrize('family', list(EXPECTED))
def test_onnx_export_equals_torch_with_the_tokenizer_beside_the_graphs(family_folder, family_export, family):
    folder = family_folder(family)
    out, metadata = family_export(family)
    context, trims, pad_id = EXPECTED[family]
    assert (metadata.context_length, metadata.dynamic_sequence, metadata.pad_id) == (context, trims, pad_id)
    hf = (folder / 'tokenizer.json').is_file()
    assert metadata.tokenizer == ('hf-tokenizers' if hf else 'openai-clip-bpe')
    assert (out / 'tokenizer.json').is_file() == hf
    torch_backend = create_backend('torch', f'local-dir:{folder}', BackendOptions(device='cpu'))
    onnx_backend = create_backend('onnx', None, BackendOptions(device='cpu'), model_path=str(out))
    tokens = onnx_backend.tokenizer(TEXTS)
    assert tokens.input_ids.tolist() == torch_backend.tokenizer(TEXTS).input_ids.tolist()
    want = torch_backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    assert relative_error(onnx_backend.encode_texts(tokens.input_ids, tokens.attention_mask), want) <= 1e-5
    pixels = np.stack([preprocess_image(_image(3), torch_backend.preprocess)])
    assert relative_error(onnx_backend.encode_images(pixels), torch_backend.encode_images(pixels)) <= 1e-5


@pytest.mark.parametrize('family', ['siglip', 'xlmr'])
def test_the_onnx_replica_tokenizes_and_encodes_without_torch_or_transformers(family_export, family):
    out, _ = family_export(family)
    code = f"""
import json, sys
from clipserve.backends.onnx.backend import OnnxBackend
backend = OnnxBackend(None, model_path={str(out)!r})
tokens = backend.tokenizer({TEXTS!r})
assert backend.encode_texts(tokens.input_ids, tokens.attention_mask).shape[0] == {len(TEXTS)}
print(json.dumps({{m: m in sys.modules for m in ('torch', 'transformers', 'open_clip')}}))
"""
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == {'torch': False, 'transformers': False, 'open_clip': False}


def test_a_folder_without_tokenizer_files_fails_saying_what_to_copy(folders, tmp_path):
    folder = tmp_path / 'no-tokenizer'
    folder.mkdir()
    for name in ('open_clip_config.json', 'open_clip_model.safetensors'):
        (folder / name).write_bytes((folders['siglip'] / name).read_bytes())
    with pytest.raises(WeightsUnavailableError, match='has no tokenizer.json: copy the tokenizer files'):
        create_backend('torch', f'local-dir:{folder}', BackendOptions(device='cpu'))


def test_missing_folder_config_and_weights_fail_clearly(folders, tmp_path):
    with pytest.raises(WeightsUnavailableError, match='does not exist'):
        resolve(parse_model_name(f'local-dir:{tmp_path / "nowhere"}'))
    with pytest.raises(WeightsUnavailableError, match='has no open_clip_config.json'):
        resolve(parse_model_name(f'local-dir:{tmp_path}'))
    (tmp_path / 'open_clip_config.json').write_text('{"model_cfg": {"embed_dim": 8}}')
    with pytest.raises(UnknownModelError, match='is not an open_clip config'):
        resolve(parse_model_name(f'local-dir:{tmp_path}'))
    weightless = tmp_path / 'weightless'
    weightless.mkdir()
    for name in ('open_clip_config.json', 'tokenizer.json', 'tokenizer_config.json'):
        (weightless / name).write_bytes((folders['siglip'] / name).read_bytes())
    with pytest.raises(WeightsUnavailableError, match='has no weights file'):
        create_backend('torch', f'local-dir:{weightless}', BackendOptions(device='cpu'))


def test_offline_without_a_cached_tokenizer_fails_fast_and_names_the_files(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    hub_offline(monkeypatch)
    with pytest.raises(WeightsUnavailableError) as info:
        create_backend('torch', 'ViT-B-16-SigLIP::random', BackendOptions(device='cpu'))
    message = str(info.value)
    assert 'timm/ViT-B-16-SigLIP' in message and 'tokenizer.json' in message and 'local-dir:' in message


def test_local_dir_names_parse_and_print_as_given(tmp_path):
    name = parse_model_name(f'local-dir:{tmp_path}')
    assert name.local_dir == str(tmp_path) and str(name) == f'local-dir:{tmp_path}'
    with pytest.raises(ValueError, match='names no folder'):
        parse_model_name('local-dir:')
    assert os.sep in str(name)


def test_a_cached_tokenizer_serves_offline_from_the_hub_cache_layout(folders, tmp_path, monkeypatch):
    """Tokenizer files downloaded once (huggingface_hub's cache layout under $CLIPSERVE_CACHE) are found
    offline without any network call, and tokenize as the model's own."""
    from clipserve.models.registry import tokenizer_folder

    cache = tmp_path / 'cache'
    snapshot = cache / 'models--timm--ViT-B-16-SigLIP' / 'snapshots' / ('0' * 40)
    snapshot.mkdir(parents=True)
    (cache / 'models--timm--ViT-B-16-SigLIP' / 'refs').mkdir()
    (cache / 'models--timm--ViT-B-16-SigLIP' / 'refs' / 'main').write_text('0' * 40)
    for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
        (snapshot / name).write_bytes((folders['siglip'] / name).read_bytes())
    monkeypatch.setenv('CLIPSERVE_CACHE', str(cache))
    hub_offline(monkeypatch)
    resolved = resolve(parse_model_name('ViT-B-16-SigLIP::random'))
    folder = tokenizer_folder(resolved)
    assert folder == snapshot
    tokens = make_tokenizer(resolved.text, folder)(['a photo of a cat'])
    assert tokens.input_ids.shape == (1, 64) and tokens.input_ids[0, -1] == 1  # padded to 64 with </s>


def test_a_hugging_face_text_tower_without_transformers_names_the_extra(family_folder, monkeypatch):
    folder = family_folder('xlmr')  # written with transformers' config class
    monkeypatch.setitem(sys.modules, 'transformers', None)  # as if not installed
    with pytest.raises(BackendUnavailableError, match=r'Hugging Face text tower .*clipserve\[hf-text\]'):
        create_backend('torch', f'local-dir:{folder}', BackendOptions(device='cpu'))


def test_without_a_mask_a_hugging_face_batch_is_masked_at_its_pad_id(family_folder):
    """MetaCLIP 2's XLM-V tokenizer pads with id 1 and its causal tower is trimmed to the batch's longest
    text: the mask the backend derives must be the tokenizer's, or real tokens are cut."""
    backend = create_backend('torch', f'local-dir:{family_folder("metaclip2")}', BackendOptions(device='cpu'))
    tokens = backend.tokenizer(['cat', 'a dog'])
    assert backend.pad_id == 1 and backend.trims_padding and (tokens.attention_mask == 0).any()
    np.testing.assert_array_equal(
        backend.encode_texts(tokens.input_ids), backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    )
