"""The PyTorch backend against open_clip itself: same model, same weights, same numbers."""

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from clipserve.backends import BackendOptions, create_backend
from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.preprocess import preprocess_image
from clipserve.models.tokenizer import Tokenizer

from ..compare import relative_error
from ..conftest import TINY
from ..hub import hub_offline

TEXTS = ['a photo of a dog', 'A DIAGRAM of the Moon!', '', 'emoji 🐶🐱 and ünïcödé', 'x ' * 200]


def _images():
    rng = np.random.default_rng(3)
    for w, h in [(224, 224), (300, 200), (64, 500), (1, 1)]:
        yield Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def _reference(backend):
    """open_clip's own preprocess + tokenizer + encode on the backend's model object."""
    cfg = backend.preprocess
    transform = open_clip.image_transform(cfg.image_size, is_train=False, mean=cfg.mean, std=cfg.std)
    with torch.inference_mode():
        images = torch.stack([transform(im) for im in _images()])
        texts = open_clip.get_tokenizer('ViT-B-32')(TEXTS)
        return backend.model.encode_image(images).numpy(), backend.model.encode_text(texts).numpy()


@pytest.mark.parametrize('model', [pytest.param(TINY, marks=pytest.mark.precision), 'ViT-B-32::random'])
def test_embeddings_equal_open_clip(model, tiny_backend):
    backend = tiny_backend if model == TINY else create_backend('torch', model, BackendOptions(device='cpu'))
    ref_images, ref_texts = _reference(backend)
    pixels = np.stack([preprocess_image(im, backend.preprocess) for im in _images()])
    ours_images = backend.encode_images(pixels)
    ours_texts = backend.encode_texts(Tokenizer(backend.context_length)(TEXTS).input_ids)
    image_diff = relative_error(ours_images, ref_images)
    text_diff = relative_error(ours_texts, ref_texts)
    print(f'\n{model}: |ours - open_clip| / |open_clip| images {image_diff:.2e}, texts {text_diff:.2e}')
    assert ours_images.dtype == np.float32 and ours_texts.dtype == np.float32
    assert image_diff < 1e-5 and text_diff < 1e-5


def test_same_name_gives_same_weights_in_a_new_backend(tiny_backend):
    again = create_backend('torch', TINY, BackendOptions(device='cpu'))
    tokens = Tokenizer()(['same weights']).input_ids
    np.testing.assert_array_equal(again.encode_texts(tokens), tiny_backend.encode_texts(tokens))


def test_model_calls_are_counted(tiny_backend):
    before = tiny_backend.model_calls
    tiny_backend.encode_texts(Tokenizer()(['a', 'b']).input_ids)
    tiny_backend.encode_images(np.zeros((2, 3, 224, 224), np.float32))
    tiny_backend.encode_texts(np.zeros((0, 77), np.int64))  # empty input: no model call
    assert tiny_backend.model_calls == before + 2


@pytest.mark.parametrize('suffix', ['.safetensors', '.bin', '.pt'])
def test_local_checkpoint_files(tmp_path, tiny_backend, suffix):
    path = tmp_path / f'weights{suffix}'
    state = {k: v.clone() for k, v in tiny_backend.model.state_dict().items()}
    with torch.no_grad():
        state['text_projection'] += 1.0  # different from the random init, so loading must really happen
    if suffix == '.safetensors':
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    loaded = create_backend('torch', f'clipserve-tiny::{path}', BackendOptions(device='cpu'))
    for key, value in state.items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


def _save(state: dict, path: Path) -> Path:
    if path.suffix == '.safetensors':
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize('suffix', ['.safetensors', '.bin'])
def test_a_checkpoint_of_the_same_weights_embeds_identically(tmp_path, tiny_backend, suffix):
    """The weights a checkpoint becomes, plus the buffers no checkpoint holds (the causal mask), give
    exactly the embeddings of the model the checkpoint was saved from."""
    path = _save(tiny_backend.model.state_dict(), tmp_path / f'same{suffix}')
    loaded = create_backend('torch', f'clipserve-tiny::{path}', BackendOptions(device='cpu'))
    tokens = Tokenizer()(TEXTS)
    pixels = np.random.default_rng(0).normal(size=(3, 3, 224, 224)).astype(np.float32)
    np.testing.assert_array_equal(loaded.encode_texts(tokens.input_ids), tiny_backend.encode_texts(tokens.input_ids))
    np.testing.assert_array_equal(loaded.encode_images(pixels), tiny_backend.encode_images(pixels))
    assert not [name for name, t in [*loaded.model.named_parameters(), *loaded.model.named_buffers()] if t.is_meta]


def test_a_model_that_cannot_load_in_place_loads_as_open_clip_does(tmp_path, tiny_backend, monkeypatch, caplog):
    """An architecture whose construction does not survive meta parameters (none known, but open_clip
    and timm keep adding models) still loads, the way open_clip does it, with a warning."""
    from clipserve.models.families import open_clip as open_clip_family

    def refuse(model, checkpoint):
        raise NotImplementedError('Cannot copy out of meta tensor')

    monkeypatch.setattr(open_clip_family, '_load_in_place', refuse)
    path = _save(tiny_backend.model.state_dict(), tmp_path / 'w.safetensors')
    with caplog.at_level('WARNING', logger='clipserve.models.families.open_clip'):
        loaded = create_backend('torch', f'clipserve-tiny::{path}', BackendOptions(device='cpu'))
    assert 'loading it as open_clip does' in caplog.text
    pixels = np.random.default_rng(0).normal(size=(2, 3, 224, 224)).astype(np.float32)
    np.testing.assert_array_equal(loaded.encode_images(pixels), tiny_backend.encode_images(pixels))


def test_a_checkpoint_loads_in_the_requested_precision(tmp_path, tiny_backend):
    """Same per-tensor dtypes as open_clip's own create_model gives for bf16 (its mixed precision rule), as
    the backend loads them (before a CPU backend packs its bf16 blocks: test_torch_packed_weights.py)."""
    from clipserve.models.names import parse_model_name
    from clipserve.models.registry import build_model, resolve

    path = _save(tiny_backend.model.state_dict(), tmp_path / 'w.safetensors')
    loaded = build_model(resolve(parse_model_name(f'clipserve-tiny::{path}')), device='cpu', precision='bf16')
    reference = open_clip.create_model(TINY.split('::')[0], pretrained=str(path), precision='bf16', device='cpu')
    assert {k: v.dtype for k, v in loaded.state_dict().items()} == {
        k: v.dtype for k, v in reference.state_dict().items()
    }
    assert torch.bfloat16 in {p.dtype for p in loaded.parameters()}
    backend = create_backend('torch', f'clipserve-tiny::{path}', BackendOptions(device='cpu', dtype='bf16'))
    assert backend.dtype == 'bf16'
    pixels = np.random.default_rng(0).normal(size=(2, 3, 224, 224)).astype(np.float32)
    cosines = _cosines(backend.encode_images(pixels), tiny_backend.encode_images(pixels))
    assert cosines.min() > 0.999


def test_a_checkpoint_is_held_once_in_memory(tmp_path):
    """Loading a ViT-B-32 checkpoint raises the process's peak memory by about one copy of the
    weights (open_clip alone builds a randomly initialised model, then loads a second copy into it)."""
    import subprocess
    import sys

    model = open_clip.create_model('ViT-B-32', pretrained=None)
    weights_mb = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    path = _save(model.state_dict(), tmp_path / 'vit-b-32.bin')
    del model
    script = (
        'import torch, open_clip\n'
        'from clipserve.backends import BackendOptions, create_backend\n'
        'peak = lambda: int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024\n'
        'before = peak()\n'
        f'create_backend("torch", "ViT-B-32::{path}", BackendOptions(device="cpu"))\n'
        'print(peak() - before)\n'
    )
    grown = float(
        subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=True).stdout.split()[-1]
    )
    assert grown < 1.3 * weights_mb, f'peak grew by {grown:.0f} MB for {weights_mb:.0f} MB of weights'


def test_checkpoint_for_the_wrong_architecture(tmp_path, tiny_backend):
    path = tmp_path / 'tiny.pt'
    torch.save(tiny_backend.model.state_dict(), path)
    with pytest.raises(WeightsUnavailableError, match='does not fit'):
        create_backend('torch', f'ViT-B-32::{path}', BackendOptions(device='cpu'))


def test_missing_checkpoint_file():
    with pytest.raises(WeightsUnavailableError, match='does not exist'):
        create_backend('torch', 'clipserve-tiny::/nonexistent/w.safetensors', BackendOptions(device='cpu'))


def test_custom_architecture_config_file(tmp_path):
    config = json.loads(
        (Path(__file__).parents[2] / 'executors/clipserve/models/configs/clipserve-tiny.json').read_text()
    )
    config['embed_dim'] = 48
    path = tmp_path / 'my-arch.json'
    path.write_text(json.dumps(config))
    backend = create_backend('torch', f'{path}::random', BackendOptions(device='cpu'))
    assert backend.embed_dim == 48
    assert backend.encode_texts(Tokenizer()(['custom']).input_ids).shape == (1, 48)


def test_bad_config_file(tmp_path):
    path = tmp_path / 'broken.json'
    path.write_text('{"embed_dim": 8}')
    with pytest.raises(UnknownModelError, match='vision_cfg'):
        create_backend('torch', f'{path}::random', BackendOptions(device='cpu'))


def test_cuda_requested_without_cuda_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip('a CUDA device is present')
    with pytest.raises(BackendUnavailableError, match='no CUDA device'):
        create_backend('torch', TINY, BackendOptions(device='cuda'))


def test_offline_without_cache_fails_at_once_with_guidance(tmp_path, monkeypatch):
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'empty-cache'))
    hub_offline(monkeypatch)
    with pytest.raises(WeightsUnavailableError) as err:
        create_backend('torch', 'ViT-B-32::openai', BackendOptions(device='cpu'))
    message = str(err.value)
    assert str(tmp_path / 'empty-cache') in message
    assert 'ViT-B-32::random' in message and '.safetensors' in message and 'CLIPSERVE_CACHE' in message


def test_pretrained_tag_loads_offline_from_the_cache(tmp_path, monkeypatch):
    """Lay out the cache as open_clip's hub download leaves it, then load with no network at all."""
    cfg = open_clip.get_pretrained_cfg('ViT-B-32', 'openai')
    repo = cfg['hf_hub'].rstrip('/')
    snapshot = tmp_path / 'cache' / f'models--{repo.replace("/", "--")}' / 'snapshots' / ('0' * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / 'refs').mkdir()
    (snapshot.parents[1] / 'refs' / 'main').write_text('0' * 40)
    source = create_backend('torch', 'ViT-B-32::random', BackendOptions(device='cpu'))
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in source.model.state_dict().items()}, str(snapshot / 'open_clip_model.safetensors')
    )
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'cache'))
    hub_offline(monkeypatch)
    loaded = create_backend('torch', 'ViT-B/32', BackendOptions(device='cpu'))
    assert loaded.model_name == 'ViT-B-32::openai'
    assert torch.equal(loaded.model.state_dict()['visual.proj'], source.model.state_dict()['visual.proj'])
    # OpenAI weights were trained with QuickGELU, so the loaded model must use it
    assert any(type(m).__name__ == 'QuickGELU' for m in loaded.model.modules())


def test_unreachable_hub_fails_fast_without_download_retries(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub_offline(monkeypatch, False)
    monkeypatch.setenv('CLIPSERVE_CACHE', str(tmp_path / 'empty-cache'))
    monkeypatch.setattr(constants, 'ENDPOINT', 'http://127.0.0.1:9')  # nothing listens on the discard port
    with pytest.raises(WeightsUnavailableError, match='127.0.0.1 is unreachable'):
        create_backend('torch', 'RN50::openai', BackendOptions(device='cpu'))


@pytest.mark.parametrize('model', [pytest.param(TINY, marks=pytest.mark.precision), 'ViT-B-32::random'])
def test_padding_trim_is_exact(model, tiny_backend):
    backend = tiny_backend if model == TINY else create_backend('torch', model, BackendOptions(device='cpu'))
    assert backend.trims_padding
    texts = ['a dog', 'a much longer caption about a dog sitting on a red chair in the garden', '!', '']
    tokens = Tokenizer(backend.context_length)(texts)
    trimmed = backend.encode_texts(tokens.input_ids, tokens.attention_mask)
    with torch.inference_mode():
        full = backend.model.encode_text(torch.from_numpy(tokens.input_ids)).numpy()
    diff = relative_error(trimmed, full)
    print(f'\n{model}: padding trim vs full 77 tokens, relative difference {diff:.2e}')
    assert diff < 1e-5


def test_mask_is_derived_from_end_of_text_when_absent(tiny_backend):
    tokens = Tokenizer()(['a dog', 'x ! ! y'])
    np.testing.assert_allclose(
        tiny_backend.encode_texts(tokens.input_ids),
        tiny_backend.encode_texts(tokens.input_ids, tokens.attention_mask),
        atol=1e-6,
    )


@pytest.fixture()
def cpu_bf16(monkeypatch):
    """Set what the CPU-flag detection answers for backends built inside the test."""
    from clipserve.backends import precision

    def force(native: bool):
        monkeypatch.setenv(precision.CPU_BF16_ENV, '1' if native else '0')
        precision.cpu_bf16.cache_clear()

    yield force
    precision.cpu_bf16.cache_clear()


def _cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.precision
def test_auto_on_a_cpu_with_native_bf16_runs_both_towers_in_bf16_close_to_fp32(cpu_bf16):
    cpu_bf16(True)
    auto = create_backend('torch', 'ViT-B-32::random', BackendOptions(device='cpu'))
    fp32 = create_backend('torch', 'ViT-B-32::random', BackendOptions(device='cpu', dtype='fp32'))
    assert (auto.precision.images, auto.precision.texts) == ('bf16', 'bf16') and auto.dtype == 'bf16'
    assert 'forced on' in auto.precision.reason
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((9, 3, 224, 224)).astype(np.float32)
    got, want = auto.encode_images(pixels), fp32.encode_images(pixels)
    assert got.dtype == np.float32 and _cosines(got, want).min() >= 0.9999
    assert np.abs(got - want).max() > 0  # bf16 did run
    # the same image gives the same embedding whatever shares its batch
    alone = np.concatenate([auto.encode_images(pixels[i : i + 1]) for i in range(3)])
    assert _cosines(alone, got[:3]).min() >= 0.9999
    tokens = auto.tokenizer(TEXTS)
    texts_auto = auto.encode_texts(tokens.input_ids, tokens.attention_mask)
    texts_fp32 = fp32.encode_texts(tokens.input_ids, tokens.attention_mask)
    # texts run twelve bf16 blocks on random weights: 0.99990 to 0.99993 from run to run on one CPU (the
    # kernels oneDNN picks vary with threads); the start-up check refuses below 0.995, the product's own line
    assert texts_auto.dtype == np.float32 and _cosines(texts_auto, texts_fp32).min() >= 0.9995
    assert np.abs(texts_auto - texts_fp32).max() > 0  # bf16 did run
    one = auto.tokenizer(TEXTS[:1])  # alone, as in its batch
    assert _cosines(auto.encode_texts(one.input_ids, one.attention_mask), texts_auto[:1]).min() >= 0.9999


@pytest.mark.precision
def test_auto_on_a_cpu_without_native_bf16_is_plain_fp32(cpu_bf16, tiny_backend):
    cpu_bf16(False)
    auto = create_backend('torch', TINY, BackendOptions(device='cpu', dtype='auto'))
    assert auto.dtype == 'fp32' and 'forced off' in auto.precision.reason
    pixels = np.random.default_rng(1).standard_normal((2, 3, auto.image_size, auto.image_size)).astype(np.float32)
    assert np.array_equal(auto.encode_images(pixels), tiny_backend.encode_images(pixels))


def test_the_image_tower_is_found_by_running_both_towers(tiny_backend):
    from clipserve.models.towers import image_only_modules

    size = tiny_backend.image_size
    tokens = tiny_backend.tokenizer(['a photo'])
    text = (torch.from_numpy(tokens.input_ids), torch.from_numpy(tokens.attention_mask))
    found = image_only_modules(tiny_backend.model, torch.zeros(1, 3, size, size), text)
    assert found == [tiny_backend.model.visual]


@pytest.mark.parametrize('dtype', ['fp32', 'bf16'])
def test_the_text_blocks_attention_on_the_batch_first_layout_is_multihead_attentions_arithmetic(dtype):
    """As the model loads (a CPU backend then packs bf16 blocks: test_torch_packed_weights.py)."""
    from clipserve.models.names import parse_model_name
    from clipserve.models.registry import build_model, resolve
    from clipserve.models.towers import TextTower

    model = build_model(resolve(parse_model_name(TINY)), device='cpu', precision=dtype)
    batch_first, own = TextTower(model, packed_attention=True), TextTower(model)
    assert batch_first.blocks is not None and own.blocks is None  # open_clip's plain blocks; MultiheadAttention's path
    tokens = Tokenizer(77)(TEXTS[:4])
    width = int(tokens.lengths.max())
    ids, mask = (torch.from_numpy(a[:, :width]) for a in (tokens.input_ids, tokens.attention_mask))
    with torch.inference_mode():
        np.testing.assert_array_equal(batch_first(ids, mask).float().numpy(), own(ids, mask).float().numpy())


def test_blocks_that_are_not_open_clips_plain_self_attention_keep_their_own_forward(tiny_backend):
    from clipserve.models.towers import packed_blocks

    model = tiny_backend.model
    assert packed_blocks(model) is not None
    block = model.transformer.resblocks[0]
    block.ln_1_kv = torch.nn.Identity()  # a cross-attention block (open_clip adds ln_1_kv for those)
    try:
        assert packed_blocks(model) is None
    finally:
        del block.ln_1_kv
    assert packed_blocks(torch.nn.Linear(2, 2)) is None  # no text transformer at all
