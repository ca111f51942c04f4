"""The one registry of model families: a parsed name's family picks the module in `families/` that resolves,
builds and finds the tokenizer files of its models. This is the door the backends and the exporter use.

Each family module has FAMILY (its name in names.py), resolve(name, ...), build(resolved, device, precision)
and tokenizer_folder(resolved); none of them imports this module (they share resolved.py and dtypes.py),
so adding a family is adding a module and a line here. Everything here needs torch.
"""

from __future__ import annotations

from pathlib import Path

import torch

from clipserve.errors import UnknownModelError
from clipserve.models.families import cnclip, late_interaction, mclip, open_clip, transformers
from clipserve.models.names import TRANSFORMERS_FAMILY, ModelName
from clipserve.models.resolved import ResolvedModel

FAMILIES = {module.FAMILY: module for module in (open_clip, mclip, cnclip, transformers, late_interaction)}


def family_module(family: str):
    """The module that builds models of `family`."""
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f'no module builds model family {family!r}') from None


def resolve(name: ModelName, trust_remote_code: bool = False, truncate_dim: int | None = None) -> ResolvedModel:
    """Check that `name` can be built and gather its config, without loading any weights.

    `trust_remote_code` and `truncate_dim` are the operator's opt-ins for transformers checkpoints
    (families/transformers.py); a truncation asked of any other model is refused.
    """
    if name.family == TRANSFORMERS_FAMILY:
        return transformers.resolve(name, trust_remote_code, truncate_dim)
    if truncate_dim is not None:
        raise UnknownModelError(
            f'truncate_dim is for Matryoshka-trained transformers checkpoints; {str(name)!r} is not one '
            '(CLIP embeddings are not trained to be truncated)'
        )
    return family_module(name.family).resolve(name)


def build_model(resolved: ResolvedModel, device: str = 'cpu', precision: str = 'fp32') -> torch.nn.Module:
    """An eval-mode model on `device`, in `precision`, with the weights `resolved` names."""
    return family_module(resolved.family).build(resolved, device, precision)


def tokenizer_folder(resolved: ResolvedModel) -> Path | None:
    """The folder holding the model's Hugging Face tokenizer files (None for open_clip's BPE models)."""
    if not resolved.text.needs_tokenizer_files:
        return None
    return family_module(resolved.family).tokenizer_folder(resolved)
