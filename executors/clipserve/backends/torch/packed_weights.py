"""bf16 transformer blocks whose weights oneDNN lays out once, at load, instead of on every call.

On a CPU, PyTorch runs a bf16 linear layer through oneDNN, which first copies the weight into its own
blocked layout, on every call. The copy costs as much for a pass of 8 short texts as for one of 256, so
it weighs most on the small passes a server runs for short queries. Packing each weight once at load
(what torch.compile's freezing does for the same kernels) leaves the products as they were and drops the
copy. The attention of open_clip's plain blocks is computed on the batch-first layout
(models/towers.py: the text tower's arithmetic), so that its two projections are packed too: without
nn.MultiheadAttention, the text tower runs its blocks' own forward. A reranker (transformers) calls its
linear modules, which are packed one by one.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from clipserve.models.towers import batch_first_attention, plain_block

logger = logging.getLogger(__name__)

#: rows a pass is expected to have: oneDNN's hint for the layout it picks (any row count runs)
ROWS_HINT = 2048


class PackedLinear(torch.nn.Module):
    """nn.Linear's product with its weight in oneDNN's layout. `weight` keeps only the shape and dtype (on
    the meta device, no memory) for code that reads them, such as open_clip's get_cast_dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        self.weight = torch.empty_like(weight, device='meta')

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, 'none', [], '')


class PackedSelfAttention(torch.nn.Module):
    """nn.MultiheadAttention's batch-first self-attention at inference, its projections packed; called as
    open_clip's blocks call nn.MultiheadAttention."""

    def __init__(self, attn: torch.nn.MultiheadAttention):
        super().__init__()
        self.num_heads = attn.num_heads
        self.in_proj = PackedLinear(attn.in_proj_weight, attn.in_proj_bias)
        self.out_proj = PackedLinear(attn.out_proj.weight, attn.out_proj.bias)

    def forward(self, query, key, value, need_weights: bool = False, attn_mask: torch.Tensor | None = None):
        if key is not query or value is not query or need_weights:
            raise ValueError('a packed attention computes self-attention only, without its weights')
        return batch_first_attention(query, self.in_proj, self.out_proj, self.num_heads, attn_mask), None


def pack_blocks(model: torch.nn.Module) -> int:
    """Pack the weights of every bf16 plain block of a CPU `model`, both towers; returns how many blocks.

    The first block is checked on a sample against its unpacked self before any is kept: if oneDNN's
    packed product is missing or answers differently, every block stays as it was (and the log says why).
    """
    blocks = [module for module in model.modules() if _packable(module)]
    if not blocks or not onednn_computes_bf16():
        return 0
    first = blocks[0]
    sample = torch.randn(2, 5, first.attn.embed_dim, generator=torch.Generator().manual_seed(0))
    sample = sample.to(torch.bfloat16)
    kept = None
    try:
        with torch.inference_mode():
            expected = first(sample)
            kept = _pack(first)
            got = first(sample)
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    except Exception as e:  # noqa: BLE001 - any failure: the blocks as they were
        if kept is not None:
            _unpack(first, kept)
        logger.info('bf16 weights left unpacked: a packed block did not answer as the plain one (%s)', e)
        return 0
    for block in blocks[1:]:
        _pack(block)
    logger.info('bf16 weights of %d transformer blocks laid out for oneDNN at load', len(blocks))
    return len(blocks)


def pack_linears(model: torch.nn.Module, sample: Callable[[], torch.Tensor]) -> int:
    """Pack every bf16 nn.Linear of a CPU `model` (a transformers reranker: its layers call their linear
    modules); returns how many. `sample` runs the model on a sample input: unless the packed model answers it
    as before, every layer stays as it was (and the log says why)."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16 and child.weight.device.type == 'cpu'
    ]
    if not swaps or not onednn_computes_bf16():
        return 0
    try:
        with torch.inference_mode():
            expected = sample()
            for parent, name, child in swaps:
                setattr(parent, name, PackedLinear(child.weight, child.bias))
            torch.testing.assert_close(sample(), expected, rtol=2e-2, atol=2e-2)
    except Exception as e:  # noqa: BLE001 - any failure: the layers as they were
        for parent, name, child in swaps:
            setattr(parent, name, child)
        logger.info('bf16 weights left unpacked: the packed model did not answer as the plain one (%s)', e)
        return 0
    logger.info('bf16 weights of %d linear layers laid out for oneDNN at load', len(swaps))
    return len(swaps)


def onednn_computes_bf16() -> bool:
    """oneDNN has bf16 kernels for this CPU (PyTorch's own test for routing bf16 products to it): elsewhere
    bf16 products run in PyTorch's fallback, which packed weights cannot use."""
    try:
        return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without the operator
        return False


def _packable(module: torch.nn.Module) -> bool:
    """An open_clip plain block whose projections are bf16 on a CPU (its layer norms may run in fp32)."""
    if not plain_block(module):
        return False
    linears = [getattr(module.mlp, name, None) for name in ('c_fc', 'c_proj')]
    if not all(isinstance(linear, torch.nn.Linear) for linear in linears):
        return False
    weights = [module.attn.in_proj_weight, module.attn.out_proj.weight] + [linear.weight for linear in linears]
    return all(w.dtype == torch.bfloat16 and w.device.type == 'cpu' for w in weights)


def _pack(block: torch.nn.Module) -> tuple:
    """Swap the block's attention and MLP projections for packed ones; returns the originals."""
    kept = (block.attn, block.mlp.c_fc, block.mlp.c_proj)
    block.attn = PackedSelfAttention(block.attn)
    block.mlp.c_fc = PackedLinear(block.mlp.c_fc.weight, block.mlp.c_fc.bias)
    block.mlp.c_proj = PackedLinear(block.mlp.c_proj.weight, block.mlp.c_proj.bias)
    return kept


def _unpack(block: torch.nn.Module, kept: tuple) -> None:
    block.attn, block.mlp.c_fc, block.mlp.c_proj = kept
