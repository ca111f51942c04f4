"""The two towers of an open_clip model as separate modules, with the text tower trimmed to real tokens.

CLIP's text transformer is causal and pools at the end-of-text position, so positions after it
never influence the result: running only up to the longest real length in a batch is exact, and a
10-word query costs ~15 of 77 positions. `TextTower` therefore accepts any sequence length up to
the context, which is also what gives the ONNX export its dynamic sequence axis.
"""

from __future__ import annotations

import torch
from open_clip.transformer import text_global_pool


def supports_trimming(model: torch.nn.Module) -> bool:
    """True for open_clip's built-in text tower (causal mask, end-of-text pooling), and for models whose
    text tower takes the attention mask (`encode_text_with_mask`: M-CLIP, CN-CLIP, transformers
    checkpoints), which attend to and pool over unmasked tokens only unless they say otherwise
    (`trims_text`)."""
    if hasattr(model, 'encode_text_with_mask'):
        return bool(getattr(model, 'trims_text', True))  # SigLIP pools at the last position: never trimmed
    return (
        getattr(model, 'attn_mask', None) is not None
        and hasattr(model, 'positional_embedding')
        and hasattr(model, 'token_embedding')
        and getattr(model, 'text_pool_type', None) in ('argmax', 'eos')
    )


class ImageTower(torch.nn.Module):
    """pixel_values [B, 3, S, S] -> image embeddings [B, D] (unnormalised)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values)


class TextTower(torch.nn.Module):
    """input_ids, attention_mask [B, L] (L <= context) -> text embeddings [B, D] (unnormalised).

    The attention mask zeroes padded positions after the final layer norm; pooling reads only the
    end-of-text position, so this changes nothing numerically but keeps the input in exported graphs
    (clip-as-service's ONNX layout has it).
    """

    def __init__(self, model: torch.nn.Module, packed_attention: bool = False):
        super().__init__()
        self.model = model
        self.trimmed = supports_trimming(model)
        # the PyTorch backend's forward: attention computed on the batch-first layout (packed_blocks)
        self.blocks = packed_blocks(model) if packed_attention and self.trimmed else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = self.model
        if hasattr(m, 'encode_text_with_mask'):
            return m.encode_text_with_mask(input_ids, attention_mask)
        if not self.trimmed:
            return m.encode_text(input_ids)
        length = input_ids.shape[1]
        cast_dtype = m.transformer.get_cast_dtype()
        x = m.token_embedding(input_ids).to(cast_dtype)
        x = x + m.positional_embedding[:length].to(cast_dtype)
        mask = m.attn_mask[:length, :length]
        if self.blocks is None:
            x = m.transformer(x, attn_mask=mask)
        else:
            mask = mask.to(x.dtype)
            for block in self.blocks:
                x = packed_block(block, x, mask)
        x = m.ln_final(x)
        x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        x = text_global_pool(x, input_ids, m.text_pool_type, eos_token_id=getattr(m, 'text_eos_id', None))
        if m.text_projection is not None:
            x = m.text_projection(x) if isinstance(m.text_projection, torch.nn.Linear) else x @ m.text_projection
        return x


def packed_blocks(model: torch.nn.Module) -> list | None:
    """The text transformer's blocks when each is open_clip's plain self-attention block, else None.

    nn.MultiheadAttention transposes a batch-first input to sequence-first before its input projection, so
    that projection multiplies a strided tensor: PyTorch runs it as a batched product over a copied weight,
    which in bf16 costs more than the whole rest of the block. `packed_block` computes the same attention on
    the batch-first layout (benchmarks/in_process.py measures the text rates).
    """
    transformer = getattr(model, 'transformer', None)
    blocks = list(getattr(transformer, 'resblocks', []))
    if not blocks or not getattr(transformer, 'batch_first', False):
        return None
    return blocks if all(plain_block(block) for block in blocks) else None


def plain_block(block: torch.nn.Module) -> bool:
    """True for open_clip's ResidualAttentionBlock doing batch-first self-attention through nn.MultiheadAttention
    with one packed input projection (not a cross-attention block)."""
    attn = getattr(block, 'attn', None)
    return (
        type(block).__name__ == 'ResidualAttentionBlock'
        and not hasattr(block, 'ln_1_kv')
        and isinstance(attn, torch.nn.MultiheadAttention)
        and attn.batch_first
        and attn._qkv_same_embed_dim
        and attn.in_proj_bias is not None
    )


def packed_block(block: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """open_clip's ResidualAttentionBlock.forward on `x` [B, L, D], the attention's products on contiguous
    batch-first tensors: the same arithmetic as nn.MultiheadAttention at inference."""
    attn = block.attn
    y = batch_first_attention(
        block.ln_1(x),
        lambda y: torch.nn.functional.linear(y, attn.in_proj_weight, attn.in_proj_bias),
        attn.out_proj,
        attn.num_heads,
        mask,
    )
    x = x + block.ls_1(y)
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def batch_first_attention(x, in_proj, out_proj, num_heads: int, mask: torch.Tensor | None) -> torch.Tensor:
    """Self-attention of `x` [B, L, D] given its joint q/k/v input projection (D -> 3D) and its output projection."""
    batch, length, width = x.shape
    q, k, v = in_proj(x).view(batch, length, 3, num_heads, width // num_heads).permute(2, 0, 3, 1, 4)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out_proj(y.transpose(1, 2).reshape(batch, length, width))


def sigmoid_logits(model: torch.nn.Module) -> tuple[float, float] | None:
    """A SigLIP model's (exp(logit_scale), logit_bias), as open_clip's get_logits applies them; None without a bias."""
    bias = getattr(model, 'logit_bias', None)
    if bias is None:
        return None
    return float(model.logit_scale.detach().float().exp()), float(bias.detach().float())


def image_only_modules(model: torch.nn.Module, pixels: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor]):
    """The largest submodules that encoding `pixels` runs and encoding `text` does not: the image tower.

    Found by running both once with hooks, so it holds for every family's layout (open_clip's `visual`,
    a transformers model's `vision_model` + `visual_projection`, ...) without naming any of them.
    """
    calls: dict[torch.nn.Module, set[str]] = {}

    def hook_for(tower):
        def hook(module, args):
            calls.setdefault(module, set()).add(tower)

        return hook

    tower = TextTower(model)
    for which, run in (('image', lambda: model.encode_image(pixels)), ('text', lambda: tower(*text))):
        handles = [m.register_forward_pre_hook(hook_for(which)) for m in model.modules()]
        try:
            with torch.inference_mode():
                run()
        finally:
            for handle in handles:
                handle.remove()

    def used(module) -> set[str]:  # by the module or anything inside it (get_image_features is no forward())
        return set().union(calls.get(module, set()), *(calls.get(m, set()) for m in module.modules()))

    def split(module):
        for child in module.children():
            towers = used(child)
            if towers == {'image'}:
                yield child
            elif towers == {'image', 'text'}:
                yield from split(child)

    return list(split(model))
