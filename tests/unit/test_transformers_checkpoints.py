"""transformers checkpoints (`transformers:/folder`): for each model type, a shrunk checkpoint written by
transformers itself (tests/model_folders.py), tokenized, preprocessed and encoded as transformers' own
tokenizer, PIL image processor and model do it; and the refusals (unknown types, code shipped with a
checkpoint, processors clipserve cannot reproduce, offline hub ids). The served parity is in
tests/integration/test_transformers_flows.py."""

import json
import shutil
import sys
import time

import numpy as np
import pytest
from PIL import Image

from clipserve.backends import BackendOptions, create_backend
from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.catalogue import catalogue
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import preprocess_image
from clipserve.models.registry import resolve

from ..model_folders import TRANSFORMERS_TYPES, transformers_checkpoint

torch = pytest.importorskip('torch')
t = pytest.importorskip('transformers')

TEXTS = [
    'a photo of a cat',
    'Café CRÈME brûlée — à la carte!',
    '東京の夜景と北京烤鸭',
    'emoji 🐶🎉 and © ™',
    'control\x00chars\x07 and\ttabs\nnewlines',
    '',
    ' '.join(['a very long caption describing a crowded street at night'] * 12),  # over every context
]
# odd and even margins around the crop, both orientations, and one already at the size
SIZES = [(45, 61), (80, 33), (32, 32), (100, 47)]
PIL_PROCESSORS = {'siglip': 'SiglipImageProcessorPil', 'chinese_clip': 'ChineseCLIPImageProcessorPil'}


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp('transformers')
    return {kind: transformers_checkpoint(root / kind, kind) for kind in TRANSFORMERS_TYPES}


def _images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]


@pytest.mark.parametrize('kind', TRANSFORMERS_TYPES)
def test_each_type_tokenizes_preprocesses_and_encodes_as_transformers_does(checkpoints, kind):
    folder = checkpoints[kind]
    backend = create_backend('torch', f'transformers:{folder}', BackendOptions(device='cpu'))
    model = t.AutoModel.from_pretrained(str(folder)).eval()
    tokenizer = t.AutoTokenizer.from_pretrained(str(folder))
    processor = getattr(t, PIL_PROCESSORS.get(kind, 'CLIPImageProcessorPil')).from_pretrained(str(folder))
    padding = 'max_length' if kind == 'siglip' else True  # as each model's documentation calls its processor
    want_tokens = tokenizer(
        TEXTS, padding=padding, truncation=True, max_length=backend.context_length, return_tensors='pt'
    )
    ours = backend.tokenizer(TEXTS)
    length = want_tokens['input_ids'].shape[1]
    np.testing.assert_array_equal(ours.input_ids[:, :length], want_tokens['input_ids'].numpy())
    assert backend.trims_padding == (kind != 'siglip')
    pixels = processor(_images(), return_tensors='pt')['pixel_values']
    ours_pixels = np.stack([preprocess_image(image, backend.preprocess) for image in _images()])
    assert np.abs(ours_pixels - pixels.numpy()).max() <= 1e-6
    with torch.no_grad():
        texts = model.get_text_features(**want_tokens).pooler_output.numpy()
        images = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    assert np.abs(backend.encode_texts(ours.input_ids, ours.attention_mask) - texts).max() <= 1e-5
    assert np.abs(backend.encode_images(ours_pixels) - images).max() <= 1e-5
    assert backend.embed_dim == texts.shape[1]


def test_names_and_the_models_listing(checkpoints):
    name = parse_model_name(f'transformers:{checkpoints["clip"]}')
    assert name.family == 'transformers' and str(name) == f'transformers:{checkpoints["clip"]}'
    assert parse_model_name('transformers:openai/clip-vit-base-patch32').transformers_source == (
        'openai/clip-vit-base-patch32'
    )
    with pytest.raises(ValueError, match='names no hub id or folder'):
        parse_model_name('transformers:')
    listed = {r.name for r in catalogue() if r.family == 'transformers'}
    assert listed == {f'transformers:<{kind} checkpoint>' for kind in TRANSFORMERS_TYPES}
    resolved = resolve(name)
    assert resolved.preprocess.crop == 'floor' and resolved.context_length == 77


def _copy(folder, tmp_path, edit_config=None, edit_processor=None):
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    for file, edit in (('config.json', edit_config), ('preprocessor_config.json', edit_processor)):
        if edit:
            data = json.loads((copy / file).read_text())
            edit(data)
            (copy / file).write_text(json.dumps(data))
    return f'transformers:{copy}'


def test_unknown_types_and_shipped_code_are_refused(checkpoints, tmp_path):
    unknown = _copy(checkpoints['clip'], tmp_path / 'a', edit_config=lambda c: c.update(model_type='blip'))
    with pytest.raises(UnknownModelError, match="model_type 'blip'.*clip, metaclip_2"):
        resolve(parse_model_name(unknown))
    naflex = _copy(checkpoints['siglip'], tmp_path / 'c', edit_config=lambda c: c.update(model_type='siglip2'))
    with pytest.raises(UnknownModelError, match='SigLIP2 NaFlex .*ViT-B-16-SigLIP2::webli'):
        resolve(parse_model_name(naflex))
    remote = _copy(
        checkpoints['clip'],
        tmp_path / 'b',
        edit_config=lambda c: c.update(model_type='jina_clip', auto_map={'AutoModel': 'modeling.JinaCLIP'}),
    )
    with pytest.raises(UnknownModelError, match='its own code .*does not run code shipped'):
        resolve(parse_model_name(remote))


@pytest.mark.parametrize(
    'edit, message',
    [
        (lambda p: p.update(size={'shortest_edge': 40}), 'only a shortest-edge resize to the crop size'),
        (lambda p: p.update(rescale_factor=0.5), 'rescale_factor 0.5 is not supported'),
        (lambda p: p.update(do_normalize=False), 'must be on'),
        (lambda p: p.update(resample='bogus'), 'not a PIL resampling filter'),
    ],
)
def test_processors_clipserve_cannot_reproduce_are_refused(checkpoints, tmp_path, edit, message):
    with pytest.raises(UnknownModelError, match=message):
        resolve(parse_model_name(_copy(checkpoints['clip'], tmp_path, edit_processor=edit)))


def test_missing_files_offline_hub_ids_and_the_missing_extra(checkpoints, tmp_path, monkeypatch):
    with pytest.raises(WeightsUnavailableError, match='is not a transformers checkpoint folder'):
        resolve(parse_model_name(f'transformers:{tmp_path}'))
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'empty-cache'))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    started = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match=r'HF_HUB_OFFLINE.*transformers:/path/to/folder'):
        create_backend('torch', 'transformers:openai/clip-vit-base-patch32', BackendOptions(device='cpu'))
    assert time.monotonic() - started < 30
    monkeypatch.setitem(sys.modules, 'transformers', None)
    with pytest.raises(BackendUnavailableError, match=r'clipserve\[transformers\]'):
        create_backend('torch', f'transformers:{checkpoints["clip"]}', BackendOptions(device='cpu'))


# ---- a checkpoint with its own code: only with the operator's opt-in ------------------------------


@pytest.fixture(scope='module')
def remote(tmp_path_factory):
    from ..model_folders import remote_code_checkpoint

    return remote_code_checkpoint(tmp_path_factory.mktemp('remote') / 'tiny-remote')


def test_shipped_code_is_refused_without_the_opt_in_and_names_its_files(remote):
    with pytest.raises(UnknownModelError, match=r'its own code .*modeling_tiny\.py.*trust_remote_code: true'):
        create_backend('torch', f'transformers:{remote}', BackendOptions(device='cpu'))
    with pytest.raises(UnknownModelError, match='trust_remote_code'):
        from clipserve.backends.onnx_export import export_onnx

        export_onnx(f'transformers:{remote}', remote.parent / 'refused')
    assert not (remote.parent / 'refused' / 'visual.onnx').exists()


def test_with_the_opt_in_the_models_own_features_serve_and_its_files_are_logged(remote, caplog):
    import hashlib

    with caplog.at_level('WARNING', logger='clipserve.models.hf_checkpoints'):
        backend = create_backend(
            'torch', f'transformers:{remote}', BackendOptions(device='cpu', trust_remote_code=True)
        )
    digest = hashlib.sha256((remote / 'modeling_tiny.py').read_bytes()).hexdigest()
    assert f'modeling_tiny.py sha256={digest}' in caplog.text
    model = t.AutoModel.from_pretrained(str(remote), trust_remote_code=True).eval()
    tokens = backend.tokenizer(TEXTS)
    pixels = np.stack([preprocess_image(image, backend.preprocess) for image in _images()])
    with torch.no_grad():
        texts = model.get_text_features(torch.from_numpy(tokens.input_ids), torch.from_numpy(tokens.attention_mask))
        images = model.get_image_features(torch.from_numpy(pixels))
    assert not backend.trims_padding  # clipserve cannot know how such a model pools
    assert np.abs(backend.encode_texts(tokens.input_ids, tokens.attention_mask) - texts.numpy()).max() <= 1e-6
    assert np.abs(backend.encode_images(pixels) - images.numpy()).max() <= 1e-6


def test_matryoshka_truncation_only_to_the_trained_sizes_and_into_the_onnx_export(remote, tmp_path):
    from clipserve.backends.onnx_export import export_onnx

    full = create_backend('torch', f'transformers:{remote}', BackendOptions(device='cpu', trust_remote_code=True))
    options = BackendOptions(device='cpu', trust_remote_code=True, truncate_dim=32)
    cut = create_backend('torch', f'transformers:{remote}', options)
    tokens = full.tokenizer(TEXTS)
    want = full.encode_texts(tokens.input_ids, tokens.attention_mask)[:, :32]
    assert cut.embed_dim == 32 and np.abs(cut.encode_texts(tokens.input_ids, tokens.attention_mask) - want).max() == 0
    export_onnx(f'transformers:{remote}', tmp_path / 'onnx', trust_remote_code=True, truncate_dim=32)
    onnx = create_backend('onnx', None, BackendOptions(device='cpu'), model_path=str(tmp_path / 'onnx'))
    assert (
        onnx.embed_dim == 32 and np.abs(onnx.encode_texts(tokens.input_ids, tokens.attention_mask) - want).max() <= 1e-5
    )
    with pytest.raises(UnknownModelError, match='trained for truncation to 16, 32, 64'):
        resolve(parse_model_name(f'transformers:{remote}'), trust_remote_code=True, truncate_dim=20)


def test_truncation_is_refused_for_models_not_trained_for_it(checkpoints):
    with pytest.raises(UnknownModelError, match='no size'):
        resolve(parse_model_name(f'transformers:{checkpoints["clip"]}'), truncate_dim=32)
    with pytest.raises(UnknownModelError, match='not trained to be truncated'):
        resolve(parse_model_name('clipserve-tiny::random'), truncate_dim=32)
