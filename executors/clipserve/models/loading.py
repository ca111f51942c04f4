"""Build an open_clip model with its weights: a pretrained tag, a local checkpoint or seeded random init.

Pretrained tags download through open_clip's own mechanism into clipserve's cache and load offline
from there afterwards. When a download is impossible the error says how to get going anyway.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import open_clip
import torch

from clipserve.errors import WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.registry import ResolvedModel

RANDOM_SEED = 0
PRECISIONS = {'fp32': 'fp32', 'fp16': 'fp16', 'bf16': 'bf16'}

logger = logging.getLogger(__name__)


def download_weights(resolved: ResolvedModel) -> str:
    """The local path of the tag's weights, downloading them into the cache on first use."""
    target = cache_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
        path = open_clip.download_pretrained(resolved.pretrained_cfg, cache_dir=str(target))
    except Exception as e:  # network, hub and file-system errors all end here
        raise WeightsUnavailableError(
            f'cannot get the weights of {resolved.name} ({type(e).__name__}: {e}). '
            f'They download on first use into the cache {str(target)!r} (set ${CACHE_ENV} to move it), '
            'and that needs network access. Offline, either copy a cache that has them, '
            f'or load a local checkpoint file with "{resolved.arch}::/path/to/weights.safetensors" '
            f'(.safetensors, .bin or .pt), or use "{resolved.arch}::random" (random weights) for smoke runs.'
        ) from e
    if not path or not os.path.isfile(path):
        raise WeightsUnavailableError(f'no weights file was found for {resolved.name} in {str(target)!r}')
    return path


def _checkpoint_path(resolved: ResolvedModel) -> str | None:
    if resolved.name.is_random:
        return None
    path = resolved.name.checkpoint_path
    if path is None:
        return download_weights(resolved)
    path = str(Path(path).expanduser())
    if not os.path.isfile(path):
        raise WeightsUnavailableError(
            f'checkpoint file {path!r} (from model name {str(resolved.name)!r}) does not exist'
        )
    return path


def build_model(resolved: ResolvedModel, device: str = 'cpu', precision: str = 'fp32') -> torch.nn.Module:
    """An eval-mode open_clip model on `device`, in `precision`, with the weights `resolved` names."""
    checkpoint = _checkpoint_path(resolved)
    kwargs = dict(
        precision=PRECISIONS[precision],
        device=device,
        force_quick_gelu=resolved.quick_gelu,
        pretrained_text=False,
        pretrained_image=False,
    )
    if checkpoint is None:
        # Seeded, and without disturbing the caller's random state: the same name gives the
        # same weights in every process, which is what cross-backend parity tests rely on.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            model = open_clip.create_model(resolved.arch, pretrained=None, **kwargs)
    else:
        try:
            model = open_clip.create_model(resolved.arch, pretrained=checkpoint, **kwargs)
        except RuntimeError as e:
            raise WeightsUnavailableError(
                f'the checkpoint {checkpoint!r} does not fit the architecture {resolved.arch!r}: {e}'
            ) from e
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    logger.info('loaded %s (%s) on %s in %s', resolved.name, checkpoint or 'random init', device, precision)
    return model
