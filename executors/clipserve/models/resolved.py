"""What resolving a model name gives: the facts every family fills in and every backend reads.

Its own module so that the registry and the families share it without importing each other; torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clipserve.models.names import OPEN_CLIP_FAMILY, ModelName
from clipserve.models.outputs import Output, declared_output
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.text_spec import TextSpec


@dataclass(frozen=True)
class ResolvedModel:
    """Everything needed to build a model: its config, weights source and preprocessing."""

    name: ModelName
    arch: str  # key in open_clip's config registry (other families: the name's own spelling)
    model_cfg: dict
    pretrained_cfg: dict  # open_clip's entry for the tag ({} for files and random)
    quick_gelu: bool  # the activation the weights were trained with
    preprocess: PreprocessConfig
    text: TextSpec
    local_dir: Path | None = None  # a `local-dir:` folder (transformers: the checkpoint's folder)
    family: str = OPEN_CLIP_FAMILY  # which family module builds it (models/families/, registry.py)
    image_model: ResolvedModel | None = None  # M-CLIP: the open_clip model whose image tower it pairs with

    @property
    def embed_dim(self) -> int:
        return int(self.model_cfg['embed_dim'])

    @property
    def context_length(self) -> int:
        return self.text.context_length

    @property
    def output(self) -> Output:
        """One vector per input, or (late interaction: ColPali, ColQwen2) a [tokens, dim] array per input."""
        return declared_output(self.model_cfg)
