"""Model names: `arch::pretrained`, clip-as-service's legacy aliases, local files, `local-dir:/folder`,
`::random`, clip-as-service's `M-CLIP/...` and `CN-CLIP/...` models, and `transformers:` checkpoints.

Parsing is pure string work so it can run (and fail with a helpful message) before anything heavy
is imported. Resolving an architecture against open_clip's registry happens in `models.registry`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_MODEL = 'ViT-B-32::openai'
RANDOM_TAG = 'random'
CHECKPOINT_SUFFIXES = ('.safetensors', '.bin', '.pt', '.pth')
CONFIG_SUFFIX = '.json'
LOCAL_DIR_PREFIX = 'local-dir:'  # open_clip's schema for a model folder
LOCAL_DIR_TAG = 'local-dir'
# clip-as-service's models beyond open_clip, by its names: `M-CLIP/<model>`, `CN-CLIP/<model>`
MCLIP_FAMILY, CNCLIP_FAMILY, OPEN_CLIP_FAMILY = 'M-CLIP', 'CN-CLIP', 'open_clip'
EXTERNAL_FAMILIES = (MCLIP_FAMILY, CNCLIP_FAMILY)
# a transformers checkpoint: `transformers:<hub id>` or `transformers:/path/to/folder`
TRANSFORMERS_PREFIX = 'transformers:'
TRANSFORMERS_FAMILY = 'transformers'
PUBLISHED_TAG = ''  # an external family's own published weights (the name alone)

# clip-as-service (and OpenAI's `clip` package) accepted these names; they all mean OpenAI weights.
LEGACY_ALIASES = {
    'ViT-B/32': 'ViT-B-32::openai',
    'ViT-B/16': 'ViT-B-16::openai',
    'ViT-L/14': 'ViT-L-14::openai',
    'ViT-L/14@336px': 'ViT-L-14-336::openai',
    'RN50': 'RN50::openai',
    'RN101': 'RN101::openai',
    'RN50x4': 'RN50x4::openai',
    'RN50x16': 'RN50x16::openai',
    'RN50x64': 'RN50x64::openai',
}


@dataclass(frozen=True)
class ModelName:
    """A parsed model name.

    `arch` is an open_clip architecture name, one of clipserve's bundled configs, or a path to a
    JSON architecture config. `pretrained` is a pretrained tag, `random`, or a checkpoint path.
    """

    arch: str
    pretrained: str

    @property
    def is_random(self) -> bool:
        return self.pretrained == RANDOM_TAG

    @property
    def checkpoint_path(self) -> str | None:
        """The local weights file, when `pretrained` names one."""
        if self.pretrained.endswith(CHECKPOINT_SUFFIXES) or os.sep in self.pretrained:
            return self.pretrained
        return None

    @property
    def local_dir(self) -> str | None:
        """The folder of a `local-dir:/path` name (open_clip's layout: open_clip_config.json, weights,
        tokenizer files)."""
        return self.arch[len(LOCAL_DIR_PREFIX) :] if self.arch.startswith(LOCAL_DIR_PREFIX) else None

    @property
    def config_path(self) -> str | None:
        """The custom architecture config file, when `arch` names one."""
        return self.arch if self.arch.endswith(CONFIG_SUFFIX) else None

    @property
    def transformers_source(self) -> str | None:
        """The hub id or folder of a `transformers:` name."""
        return self.arch[len(TRANSFORMERS_PREFIX) :] if self.arch.startswith(TRANSFORMERS_PREFIX) else None

    @property
    def family(self) -> str:
        """Which code builds the model: open_clip, transformers, or one of clip-as-service's M-CLIP / CN-CLIP ports."""
        if self.transformers_source is not None:
            return TRANSFORMERS_FAMILY
        prefix = self.arch.split('/', 1)[0]
        return prefix if '/' in self.arch and prefix in EXTERNAL_FAMILIES else OPEN_CLIP_FAMILY

    def __str__(self) -> str:
        if self.local_dir is not None or self.pretrained == PUBLISHED_TAG:
            return self.arch
        return f'{self.arch}::{self.pretrained}'


def parse_model_name(name: str | ModelName | None) -> ModelName:
    """Split `name` into architecture and weights, expanding legacy aliases.

    Like clip-as-service, a bare architecture means OpenAI weights (`RN50` -> `RN50::openai`).
    A ModelName (parsed once, by the executor's settings) passes through as it is.
    """
    if isinstance(name, ModelName):
        return name
    if name is None or not str(name).strip():
        name = DEFAULT_MODEL
    name = str(name).strip()
    if name.startswith(LOCAL_DIR_PREFIX):
        if not name[len(LOCAL_DIR_PREFIX) :].strip():
            raise ValueError(f'model name {name!r} names no folder after "{LOCAL_DIR_PREFIX}"')
        return ModelName(arch=name, pretrained=LOCAL_DIR_TAG)
    if name.startswith(TRANSFORMERS_PREFIX):
        if not name[len(TRANSFORMERS_PREFIX) :].strip():
            raise ValueError(f'model name {name!r} names no hub id or folder after "{TRANSFORMERS_PREFIX}"')
        return ModelName(arch=name, pretrained=PUBLISHED_TAG)
    name = LEGACY_ALIASES.get(name, name)
    arch, sep, pretrained = name.partition('::')
    arch = LEGACY_ALIASES.get(arch, arch).split('::')[0]
    if not arch:
        raise ValueError(f'model name {name!r} has no architecture before "::"')
    if arch.split('/', 1)[0] in EXTERNAL_FAMILIES:  # `M-CLIP/<model>` alone: that model's published weights
        return ModelName(arch=arch, pretrained=pretrained.strip() if sep else PUBLISHED_TAG)
    return ModelName(arch=arch, pretrained=pretrained.strip() if sep else 'openai')


def canonical(model: str) -> str | None:
    """The canonical name of a model name (`ViT-B/32` -> `ViT-B-32::openai`), None if it is not one."""
    try:
        return str(parse_model_name(model))
    except ValueError:
        return None
