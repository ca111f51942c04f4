"""transformers checkpoints (`transformers:/folder`): for each model type, a shrunk checkpoint written by
transformers itself (devkit/model_folders.py), tokenized, preprocessed and encoded as transformers' own
tokenizer, PIL image processor and model do it (SigLIP2's NaFlex patches for images of any shape, in torch
and in a torch-free ONNX replica); and the refusals (unknown types, code shipped with a checkpoint,
processors clipserve cannot reproduce, offline hub ids). The served parity is in
tests/integration/test_transformers_flows.py."""

import json
import shutil
import subprocess
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

from ..compare import relative_error
from ..hub import hub_offline
from ..transformers_folders import TRANSFORMERS_TYPES, transformers_checkpoint

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
PIL_PROCESSORS = {
    'siglip': 'SiglipImageProcessorPil',
    'siglip2': 'Siglip2ImageProcessorPil',
    'chinese_clip': 'ChineseCLIPImageProcessorPil',
}
SIGMOID = ('siglip', 'siglip2')  # pool at the last position: padded to exactly the context
# NaFlex shapes: tiny (upscaled), very wide and very tall (one patch row / column), larger than the patch
# budget, square, and the tests' usual ones
NAFLEX_SIZES = [(3, 4), (10, 300), (300, 12), (640, 480), (32, 32), *SIZES]


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp('transformers')
    return {kind: transformers_checkpoint(root / kind, kind) for kind in TRANSFORMERS_TYPES}


def _images(sizes=SIZES):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def _processor_inputs(kind, folder, images):
    """transformers' PIL image processor's tensors for the model, and clipserve's arrays of the same images."""
    processor = getattr(t, PIL_PROCESSORS.get(kind, 'CLIPImageProcessorPil')).from_pretrained(str(folder))
    return dict(processor(images, return_tensors='pt'))


def _assert_same_pixels(ours, inputs):
    """clipserve's arrays carry what the processor gives the model (NaFlex: the three inputs, naflex.py)."""
    if 'spatial_shapes' not in inputs:
        assert np.abs(ours - inputs['pixel_values'].numpy()).max() <= 1e-6
        return
    assert np.abs(ours[..., :-3] - inputs['pixel_values'].numpy()).max() <= 1e-6
    np.testing.assert_array_equal(ours[..., -3], inputs['pixel_attention_mask'].numpy())
    np.testing.assert_array_equal(ours[..., -2:].sum(axis=1), inputs['spatial_shapes'].numpy())


@pytest.mark.parametrize('kind', TRANSFORMERS_TYPES)
def test_each_type_tokenizes_preprocesses_and_encodes_as_transformers_does(checkpoints, kind):
    folder = checkpoints[kind]
    backend = create_backend('torch', f'transformers:{folder}', BackendOptions(device='cpu'))
    model = t.AutoModel.from_pretrained(str(folder)).eval()
    tokenizer = t.AutoTokenizer.from_pretrained(str(folder))
    padding = 'max_length' if kind in SIGMOID else True  # as each model's documentation calls its processor
    want_tokens = tokenizer(
        TEXTS, padding=padding, truncation=True, max_length=backend.context_length, return_tensors='pt'
    )
    ours = backend.tokenizer(TEXTS)
    length = want_tokens['input_ids'].shape[1]
    np.testing.assert_array_equal(ours.input_ids[:, :length], want_tokens['input_ids'].numpy())
    np.testing.assert_array_equal(ours.attention_mask[:, :length], want_tokens['attention_mask'].numpy())
    assert backend.trims_padding == (kind not in SIGMOID)
    images = _images(NAFLEX_SIZES if kind == 'siglip2' else SIZES)
    inputs = _processor_inputs(kind, folder, images)
    ours_pixels = np.stack([preprocess_image(image, backend.preprocess) for image in images])
    _assert_same_pixels(ours_pixels, inputs)
    with torch.no_grad():
        texts = model.get_text_features(**want_tokens).pooler_output.numpy()
        want_images = model.get_image_features(**inputs).pooler_output.numpy()
    assert relative_error(backend.encode_texts(ours.input_ids, ours.attention_mask), texts) <= 1e-5
    assert relative_error(backend.encode_images(ours_pixels), want_images) <= 1e-5
    assert backend.embed_dim == texts.shape[1]
    assert (backend.sigmoid_logits is not None) == (kind in SIGMOID)  # /rank's siglip_score


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
    hub_offline(monkeypatch)
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
    from ..transformers_folders import remote_code_checkpoint

    return remote_code_checkpoint(tmp_path_factory.mktemp('remote') / 'tiny-remote')


def test_shipped_code_is_refused_without_the_opt_in_and_names_its_files(remote):
    with pytest.raises(UnknownModelError, match=r'its own code .*modeling_tiny\.py.*trust_remote_code: true'):
        create_backend('torch', f'transformers:{remote}', BackendOptions(device='cpu'))
    with pytest.raises(UnknownModelError, match='trust_remote_code'):
        from clipserve.backends.onnx.export import export_onnx

        export_onnx(f'transformers:{remote}', remote.parent / 'refused')
    assert not (remote.parent / 'refused' / 'visual.onnx').exists()


def test_with_the_opt_in_the_models_own_features_serve_and_its_files_are_logged(remote, caplog):
    import hashlib

    with caplog.at_level('WARNING', logger='clipserve.models.families.transformers'):
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
    assert relative_error(backend.encode_texts(tokens.input_ids, tokens.attention_mask), texts.numpy()) <= 1e-6
    assert relative_error(backend.encode_images(pixels), images.numpy()) <= 1e-6


def test_matryoshka_truncation_only_to_the_trained_sizes_and_into_the_onnx_export(remote, tmp_path):
    from clipserve.backends.onnx.export import export_onnx

    full = create_backend('torch', f'transformers:{remote}', BackendOptions(device='cpu', trust_remote_code=True))
    options = BackendOptions(device='cpu', trust_remote_code=True, truncate_dim=32)
    cut = create_backend('torch', f'transformers:{remote}', options)
    tokens = full.tokenizer(TEXTS)
    want = full.encode_texts(tokens.input_ids, tokens.attention_mask)[:, :32]
    assert cut.embed_dim == 32 and np.abs(cut.encode_texts(tokens.input_ids, tokens.attention_mask) - want).max() == 0
    export_onnx(f'transformers:{remote}', tmp_path / 'onnx', trust_remote_code=True, truncate_dim=32)
    onnx = create_backend('onnx', None, BackendOptions(device='cpu'), model_path=str(tmp_path / 'onnx'))
    assert (
        onnx.embed_dim == 32
        and relative_error(onnx.encode_texts(tokens.input_ids, tokens.attention_mask), want) <= 1e-5
    )
    with pytest.raises(UnknownModelError, match='trained for truncation to 16, 32, 64'):
        resolve(parse_model_name(f'transformers:{remote}'), trust_remote_code=True, truncate_dim=20)


def test_truncation_is_refused_for_models_not_trained_for_it(checkpoints):
    with pytest.raises(UnknownModelError, match='no size'):
        resolve(parse_model_name(f'transformers:{checkpoints["clip"]}'), truncate_dim=32)
    with pytest.raises(UnknownModelError, match='not trained to be truncated'):
        resolve(parse_model_name('clipserve-tiny::random'), truncate_dim=32)


# ---- SigLIP2 NaFlex: a patch grid per image ----------------------------------------------------------


def test_siglip2_reads_its_naflex_processor_and_gemma_tokenizer_facts(checkpoints, tmp_path):
    from clipserve.models.families.transformers import split_naflex
    from clipserve.models.preprocess import PreprocessConfig

    resolved = resolve(parse_model_name(f'transformers:{checkpoints["siglip2"]}'))
    config = resolved.preprocess
    assert (config.resize_mode, config.patch_size, config.max_num_patches) == ('naflex', 8, 20)
    assert config.interpolation == 'bilinear' and config.image_size == 32  # nominal: warm-up, listings
    assert resolved.text.clean == 'siglip2' and not resolved.text.causal and resolved.context_length == 64
    defaults = _copy(checkpoints['siglip2'], tmp_path, edit_processor=lambda p: p.pop('patch_size'))
    assert resolve(parse_model_name(defaults)).preprocess.patch_size == 16  # the processor class's default
    with pytest.raises(ValueError, match="'naflex' and only it needs patch_size"):
        PreprocessConfig(resize_mode='naflex')
    # the layout's shape columns count ones: exact in bf16 too, where 300 is not
    arrays = np.stack([preprocess_image(image, config) for image in _images(NAFLEX_SIZES)])
    inputs = split_naflex(torch.from_numpy(arrays).to(torch.bfloat16))
    want = _processor_inputs('siglip2', checkpoints['siglip2'], _images(NAFLEX_SIZES))
    assert inputs['spatial_shapes'].tolist() == want['spatial_shapes'].tolist()
    assert inputs['pixel_attention_mask'].tolist() == want['pixel_attention_mask'].tolist()


@pytest.fixture(scope='module')
def siglip2_export(checkpoints, tmp_path_factory):
    from clipserve.backends.onnx.export import export_onnx

    out = tmp_path_factory.mktemp('siglip2-onnx')
    metadata = export_onnx(f'transformers:{checkpoints["siglip2"]}', out)
    return out, metadata


def test_siglip2_exports_and_the_onnx_replica_equals_transformers_without_torch(checkpoints, siglip2_export, tmp_path):
    """The graph takes naflex.py's layout and resizes the position grid itself, per image; the replica
    preprocesses and tokenizes from clipserve.json and the tokenizer files, importing neither torch nor
    transformers."""
    out, metadata = siglip2_export
    assert metadata.resize_mode == 'naflex' and (metadata.patch_size, metadata.max_num_patches) == (8, 20)
    assert metadata.clean == 'siglip2' and metadata.max_abs_diff['visual'] <= 1e-4
    images = _images(NAFLEX_SIZES)
    blobs = []
    for image in images:
        buffer = __import__('io').BytesIO()
        image.save(buffer, format='PNG')
        blobs.append(buffer.getvalue())
    (tmp_path / 'blobs.json').write_text(json.dumps([b.hex() for b in blobs]))
    code = f"""
import json, sys
import numpy as np
from clipserve.backends import BackendOptions
from clipserve.backends.onnx.backend import OnnxBackend
from clipserve.models.preprocess import preprocess_bytes
backend = OnnxBackend(None, BackendOptions(device='cpu'), model_path={str(out)!r})
blobs = [bytes.fromhex(b) for b in json.loads(open({str(tmp_path / 'blobs.json')!r}).read())]
pixels = np.stack([preprocess_bytes(b, backend.preprocess) for b in blobs])
tokens = backend.tokenizer({TEXTS!r})
np.save({str(tmp_path / 'images.npy')!r}, backend.encode_images(pixels))
np.save({str(tmp_path / 'texts.npy')!r}, backend.encode_texts(tokens.input_ids, tokens.attention_mask))
np.save({str(tmp_path / 'ids.npy')!r}, tokens.input_ids)
print(json.dumps({{m: m in sys.modules for m in ('torch', 'transformers', 'open_clip')}}))
"""
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == {'torch': False, 'transformers': False, 'open_clip': False}
    folder = checkpoints['siglip2']
    model = t.AutoModel.from_pretrained(str(folder)).eval()
    tokens = t.AutoTokenizer.from_pretrained(str(folder))(
        TEXTS, padding='max_length', truncation=True, max_length=64, return_tensors='pt'
    )
    np.testing.assert_array_equal(np.load(tmp_path / 'ids.npy'), tokens['input_ids'].numpy())
    with torch.no_grad():
        want_texts = model.get_text_features(**tokens).pooler_output.numpy()
        want_images = model.get_image_features(**_processor_inputs('siglip2', folder, images)).pooler_output.numpy()
    assert relative_error(np.load(tmp_path / 'texts.npy'), want_texts) <= 1e-5
    assert relative_error(np.load(tmp_path / 'images.npy'), want_images) <= 1e-5


def test_backends_built_around_one_image_shape_refuse_a_naflex_export(siglip2_export):
    from clipserve.backends.export_format import read_metadata, require_fixed_size

    with pytest.raises(BackendUnavailableError, match='NaFlex .*not serve; serve it with the torch or onnx'):
        require_fixed_size(read_metadata(siglip2_export[0]), 'tensorrt')


def _auto_on_a_bf16_cpu(folder, monkeypatch):
    """The checkpoint at `dtype: auto` on a CPU whose bf16 detection is forced on."""
    from clipserve.backends import precision

    monkeypatch.setenv(precision.CPU_BF16_ENV, '1')
    precision.cpu_bf16.cache_clear()
    try:
        return create_backend('torch', f'transformers:{folder}', BackendOptions(device='cpu'))
    finally:
        precision.cpu_bf16.cache_clear()


@pytest.mark.parametrize('kind', TRANSFORMERS_TYPES)
def test_a_bf16_image_tower_beside_an_fp32_text_tower_casts_each_types_image_tower_only(checkpoints, kind, monkeypatch):
    """Where the precision table splits the towers (CPU_BF16_AUTO), the image tower alone is cast."""
    from clipserve.backends import precision
    from clipserve.models.towers import image_only_modules  # noqa: F401 - what the backend uses to find the tower

    monkeypatch.setitem(precision.CPU_BF16_AUTO, 'torch', ('bf16', 'fp32'))
    auto = _auto_on_a_bf16_cpu(checkpoints[kind], monkeypatch)
    fp32 = create_backend('torch', f'transformers:{checkpoints[kind]}', BackendOptions(device='cpu', dtype='fp32'))
    assert auto.dtype == 'bf16 images, fp32 texts', auto.precision.reason
    dtypes = {p.dtype for name, p in auto.model.named_parameters() if 'vision' in name or 'visual' in name}
    assert dtypes == {torch.bfloat16}
    texts = {p.dtype for name, p in auto.model.named_parameters() if 'text' in name}
    assert texts == {torch.float32}
    images = _images(NAFLEX_SIZES if kind == 'siglip2' else SIZES)
    pixels = np.stack([preprocess_image(image, auto.preprocess) for image in images])
    got, want = auto.encode_images(pixels), fp32.encode_images(pixels)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.99
    tokens = auto.tokenizer(TEXTS)
    np.testing.assert_array_equal(
        auto.encode_texts(tokens.input_ids, tokens.attention_mask),
        fp32.encode_texts(tokens.input_ids, tokens.attention_mask),
    )


@pytest.mark.parametrize('kind', TRANSFORMERS_TYPES)
def test_auto_on_a_bf16_cpu_runs_each_types_text_tower_in_bf16_close_to_fp32(checkpoints, kind, monkeypatch):
    auto = _auto_on_a_bf16_cpu(checkpoints[kind], monkeypatch)
    fp32 = create_backend('torch', f'transformers:{checkpoints[kind]}', BackendOptions(device='cpu', dtype='fp32'))
    assert auto.dtype == 'bf16', auto.precision.reason
    tokens = auto.tokenizer(TEXTS)
    got = auto.encode_texts(tokens.input_ids, tokens.attention_mask)
    want = fp32.encode_texts(tokens.input_ids, tokens.attention_mask)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert got.dtype == np.float32 and cosine.min() > 0.99


def test_code_from_another_repository_is_fetched_into_the_cache_logged_and_run_only_with_the_opt_in(
    tmp_path, monkeypatch, caplog
):
    import hashlib

    from ..transformers_folders import remote_code_in_another_repository

    cache = tmp_path / 'cache'
    monkeypatch.setenv('CLIPSERVE_CACHE', str(cache))
    hub_offline(monkeypatch)
    folder = remote_code_in_another_repository(tmp_path / 'tiny-remote', cache)
    name = f'transformers:{folder}'
    with pytest.raises(UnknownModelError, match=r'modeling_tiny\.py from clipserve-tests/tiny-implementation'):
        create_backend('torch', name, BackendOptions(device='cpu'))
    with caplog.at_level('WARNING', logger='clipserve.models.families.transformers'):
        backend = create_backend('torch', name, BackendOptions(device='cpu', trust_remote_code=True))
    code = next(cache.glob('models--clipserve-tests--tiny-implementation/snapshots/*/modeling_tiny.py'))
    digest = hashlib.sha256(code.read_bytes()).hexdigest()
    assert f'clipserve-tests/tiny-implementation/modeling_tiny.py sha256={digest}' in caplog.text
    tokens = backend.tokenizer(TEXTS)
    assert backend.encode_texts(tokens.input_ids, tokens.attention_mask).shape == (len(TEXTS), backend.embed_dim)
    code.unlink()  # not in the cache, and offline: a clear error naming the repository
    with pytest.raises(WeightsUnavailableError, match=r"repository 'clipserve-tests/tiny-implementation'"):
        create_backend('torch', name, BackendOptions(device='cpu', trust_remote_code=True))
