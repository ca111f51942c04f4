"""bf16 blocks with their weights laid out for oneDNN once at load (backends/torch/packed_weights.py)."""

import logging

import numpy as np
import pytest
import torch

from clipserve.backends import BackendOptions, create_backend
from clipserve.backends.torch import packed_weights
from clipserve.backends.torch.packed_weights import PackedSelfAttention, pack_blocks
from clipserve.models.names import parse_model_name
from clipserve.models.registry import build_model, resolve
from clipserve.models.tokenizer import Tokenizer
from clipserve.models.towers import TextTower

from ..conftest import TINY

TEXTS = ['a photo of a dog', 'two cats on a sofa in the evening sun', 'red']
ONEDNN_BF16 = packed_weights.onednn_computes_bf16()


def _model(precision: str = 'bf16') -> torch.nn.Module:
    return build_model(resolve(parse_model_name(TINY)), device='cpu', precision=precision)


def _blocks(model) -> list:
    return list(model.transformer.resblocks) + list(model.visual.transformer.resblocks)


def _embed(model):
    tokens = Tokenizer(77)(TEXTS)
    size = model.visual.image_size
    size = size if isinstance(size, tuple) else (size, size)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, *size)).astype(np.float32))
    width = int(tokens.lengths.max())  # trimmed to the longest text, as the backend runs them
    with torch.inference_mode():
        texts = TextTower(model, packed_attention=True)(
            torch.from_numpy(tokens.input_ids[:, :width]), torch.from_numpy(tokens.attention_mask[:, :width])
        )
        images = model.encode_image(pixels.to(torch.bfloat16))
    return texts.float().numpy(), images.float().numpy()


def _cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_packed_blocks_embed_as_the_plain_ones():
    model = _model()
    texts, images = _embed(model)
    packed = pack_blocks(model)
    if not ONEDNN_BF16:  # an AVX2 CPU: bf16 products run outside oneDNN, nothing to pack
        assert packed == 0 and not any(isinstance(b.attn, PackedSelfAttention) for b in _blocks(model))
        return
    assert packed == len(_blocks(model)) and all(isinstance(b.attn, PackedSelfAttention) for b in _blocks(model))
    assert model.transformer.get_cast_dtype() == torch.bfloat16  # open_clip still reads the weights' dtype
    packed_texts, packed_images = _embed(model)
    # texts: the same products as the text tower's batch-first path, in the same order
    np.testing.assert_array_equal(packed_texts, texts)
    # images: the attention leaves nn.MultiheadAttention's own kernel for the batch-first one (bf16 rounding)
    assert _cosines(packed_images, images).min() > 0.9999


def test_fp32_blocks_and_cross_attention_blocks_are_not_packed():
    assert pack_blocks(_model('fp32')) == 0
    model = _model()
    for block in model.visual.transformer.resblocks:
        block.ln_1_kv = torch.nn.Identity()  # how open_clip marks a cross-attention block
    packed = pack_blocks(model)
    assert all(isinstance(b.attn, torch.nn.MultiheadAttention) for b in model.visual.transformer.resblocks)
    assert packed == (len(model.transformer.resblocks) if ONEDNN_BF16 else 0)


@pytest.mark.skipif(not ONEDNN_BF16, reason='oneDNN has no bf16 kernels for this CPU: nothing is packed')
def test_a_packed_block_that_answers_differently_leaves_every_block_as_it_was(monkeypatch, caplog):
    model = _model()
    texts, images = _embed(model)
    plain = PackedSelfAttention.forward
    monkeypatch.setattr(PackedSelfAttention, 'forward', lambda self, *a, **k: (plain(self, *a, **k)[0] * 1.5, None))
    with caplog.at_level(logging.INFO, logger=packed_weights.__name__):
        assert pack_blocks(model) == 0
    assert 'left unpacked' in caplog.text
    assert all(isinstance(b.attn, torch.nn.MultiheadAttention) for b in _blocks(model))
    monkeypatch.undo()
    again_texts, again_images = _embed(model)
    np.testing.assert_array_equal(again_texts, texts)
    np.testing.assert_array_equal(again_images, images)


def test_the_backend_packs_bf16_on_a_cpu_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger=packed_weights.__name__):
        bf16 = create_backend('torch', TINY, BackendOptions(device='cpu', dtype='bf16'))
    fp32 = create_backend('torch', TINY, BackendOptions(device='cpu', dtype='fp32'))
    assert fp32.packed_blocks == 0
    if not ONEDNN_BF16:
        assert bf16.packed_blocks == 0
        return
    assert bf16.packed_blocks == len(_blocks(bf16.model))
    assert f'bf16 weights of {bf16.packed_blocks} transformer blocks laid out for oneDNN' in caplog.text
    tokens = bf16.tokenizer(TEXTS)
    cosines = _cosines(
        bf16.encode_texts(tokens.input_ids, tokens.attention_mask),
        fp32.encode_texts(tokens.input_ids, tokens.attention_mask),
    )
    assert cosines.min() > 0.999
