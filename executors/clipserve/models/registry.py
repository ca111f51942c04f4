"""Resolve parsed model names against open_clip's registry and clipserve's bundled configs.

Everything here needs open_clip (and so torch); serving paths without torch never import it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import open_clip

from clipserve.errors import UnknownModelError, WeightsUnavailableError
from clipserve.models.cache import cache_dir
from clipserve.models.names import CNCLIP_FAMILY, MCLIP_FAMILY, OPEN_CLIP_FAMILY, TRANSFORMERS_FAMILY, ModelName
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.text_spec import TextSpec

LOCAL_CONFIG_FILE = 'open_clip_config.json'  # open_clip's local-dir / hf-hub layout

BUNDLED_CONFIGS = Path(__file__).parent / 'configs'
open_clip.add_model_config(BUNDLED_CONFIGS)


@dataclass(frozen=True)
class ResolvedModel:
    """Everything needed to build a model: its open_clip config, weights source and preprocessing."""

    name: ModelName
    arch: str  # key in open_clip's config registry
    model_cfg: dict
    pretrained_cfg: dict  # open_clip's entry for the tag ({} for files and random)
    quick_gelu: bool  # the activation the weights were trained with
    preprocess: PreprocessConfig
    text: TextSpec
    local_dir: Path | None = None  # a `local-dir:` folder: weights and tokenizer files live there
    family: str = OPEN_CLIP_FAMILY  # which code builds it: open_clip, or clip-as-service's M-CLIP / CN-CLIP
    image_model: ResolvedModel | None = None  # M-CLIP: the open_clip model whose image tower it pairs with

    @property
    def embed_dim(self) -> int:
        return int(self.model_cfg['embed_dim'])

    @property
    def context_length(self) -> int:
        return self.text.context_length


def known_architectures() -> list[str]:
    return sorted(open_clip.list_models())


def _register_config_file(path: str) -> str:
    config = Path(path).expanduser()
    if not config.is_file():
        raise UnknownModelError(f'architecture config file {str(config)!r} does not exist')
    try:
        content = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise UnknownModelError(f'architecture config file {str(config)!r} is not valid JSON: {e}') from e
    if not all(key in content for key in ('embed_dim', 'vision_cfg', 'text_cfg')):
        raise UnknownModelError(
            f'architecture config file {str(config)!r} needs the keys embed_dim, vision_cfg and text_cfg '
            "(the format of open_clip's model_configs/*.json)"
        )
    open_clip.add_model_config(config)
    return config.stem


def _read_local_dir(name: ModelName) -> tuple[Path, dict]:
    folder = Path(name.local_dir).expanduser()
    config = folder / LOCAL_CONFIG_FILE
    if not folder.is_dir():
        raise WeightsUnavailableError(f'model folder {str(folder)!r} (from {str(name)!r}) does not exist')
    if not config.is_file():
        raise WeightsUnavailableError(
            f"model folder {str(folder)!r} has no {LOCAL_CONFIG_FILE}: a local-dir folder holds open_clip's "
            f'{LOCAL_CONFIG_FILE} ({{"model_cfg": ..., "preprocess_cfg": ...}}), the weights '
            '(open_clip_model.safetensors or open_clip_pytorch_model.bin) and, for Hugging Face tokenizers, '
            'tokenizer.json with its tokenizer_config.json'
        )
    try:
        content = json.loads(config.read_text(encoding='utf-8'))
        model_cfg = content['model_cfg']
        if not all(key in model_cfg for key in ('embed_dim', 'vision_cfg', 'text_cfg')):
            raise KeyError('model_cfg needs embed_dim, vision_cfg and text_cfg')
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnknownModelError(f'{str(config)!r} is not an open_clip config: {type(e).__name__}: {e}') from e
    return folder, content


def _register_local_config(model_cfg: dict) -> str:
    """Register a local-dir folder's model config with open_clip under a name derived from its content
    (open_clip registers configs from files, so the file is written once into the cache, or into a
    temporary folder where the cache is read-only)."""
    text = json.dumps(model_cfg, sort_keys=True)
    arch = 'local-' + hashlib.sha256(text.encode()).hexdigest()[:16]
    if open_clip.get_model_config(arch) is None:
        try:
            path = _write_once(cache_dir() / 'model-configs', f'{arch}.json', text)
        except OSError:
            path = _write_once(Path(tempfile.mkdtemp(prefix='clipserve-configs-')), f'{arch}.json', text)
        open_clip.add_model_config(path)
    return arch


def _write_once(folder: Path, name: str, text: str) -> Path:
    """`folder/name` holding `text`, written atomically unless it is already there."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file():
        with tempfile.NamedTemporaryFile('w', dir=folder, suffix='.tmp', delete=False) as f:
            f.write(text)
        os.replace(f.name, path)
    return path


def _resolve_arch(name: ModelName) -> str:
    if name.config_path:
        return _register_config_file(name.config_path)
    arch = name.arch.replace('/', '-')
    if open_clip.get_model_config(arch) is None:
        close = difflib.get_close_matches(arch, known_architectures(), n=5, cutoff=0.5)
        hint = f' Did you mean: {", ".join(close)}?' if close else ''
        raise UnknownModelError(
            f'unknown model architecture {name.arch!r} in {str(name)!r}.{hint} '
            'Names are "arch::pretrained" (e.g. "ViT-B-32::openai"); `python -m clipserve models` lists them.'
        )
    return arch


def _resolve_tag(arch: str, name: ModelName) -> dict:
    """open_clip's pretrained entry for the tag; clip-as-service spelled tags with '-' where open_clip uses '_'."""
    for tag in (name.pretrained, name.pretrained.replace('-', '_')):
        cfg = open_clip.get_pretrained_cfg(arch, tag)
        if cfg:
            return cfg
    tags = open_clip.list_pretrained_tags_by_model(arch)
    close = difflib.get_close_matches(name.pretrained.replace('-', '_'), tags, n=5, cutoff=0.4)
    hint = f' Did you mean: {", ".join(close)}?' if close else ''
    raise UnknownModelError(
        f'unknown pretrained weights {name.pretrained!r} for {arch!r}.{hint} '
        f'Known tags for {arch}: {", ".join(tags) or "none"}; '
        'or give a checkpoint file (arch::/path/to/weights.safetensors) or "random".'
    )


def family_module(family: str):
    """The module for a model open_clip does not build (M-CLIP, CN-CLIP, transformers checkpoints). Each
    has resolve(name, ...), build(resolved, device, precision) and tokenizer_folder(resolved); imported only
    when such a model is named."""
    if family == MCLIP_FAMILY:
        from clipserve.models import mclip

        return mclip
    if family == CNCLIP_FAMILY:
        from clipserve.models import cnclip

        return cnclip
    if family == TRANSFORMERS_FAMILY:
        from clipserve.models import hf_checkpoints

        return hf_checkpoints
    raise ValueError(f'no module builds model family {family!r}')


def resolve(name: ModelName, trust_remote_code: bool = False, truncate_dim: int | None = None) -> ResolvedModel:
    """Check that `name` can be built and gather its config, without loading any weights.

    `trust_remote_code` and `truncate_dim` are the operator's opt-ins for transformers checkpoints
    (models/hf_checkpoints.py); a truncation asked of any other model is refused.
    """
    if name.family == TRANSFORMERS_FAMILY:
        return family_module(name.family).resolve(name, trust_remote_code, truncate_dim)
    if truncate_dim is not None:
        raise UnknownModelError(
            f'truncate_dim is for Matryoshka-trained transformers checkpoints; {str(name)!r} is not one '
            '(CLIP embeddings are not trained to be truncated)'
        )
    if name.family != OPEN_CLIP_FAMILY:
        return family_module(name.family).resolve(name)
    local_dir = None
    if name.local_dir is not None:
        local_dir, content = _read_local_dir(name)
        arch = _register_local_config(content['model_cfg'])
        pretrained_cfg = dict(content.get('preprocess_cfg') or {})
    else:
        arch = _resolve_arch(name)
    model_cfg = open_clip.get_model_config(arch)
    try:
        text = TextSpec.from_open_clip(model_cfg)
    except ValueError as e:
        raise UnknownModelError(f'{str(name)!r} cannot be served: its text side is not supported ({e})') from e
    if local_dir is None:
        pretrained_cfg = {} if (name.is_random or name.checkpoint_path) else _resolve_tag(arch, name)
    quick_gelu = bool(model_cfg.get('quick_gelu', False) or pretrained_cfg.get('quick_gelu', False))
    image_size = model_cfg['vision_cfg'].get('image_size', 224)
    preprocess = PreprocessConfig.from_open_clip({**pretrained_cfg, 'size': image_size})
    return ResolvedModel(
        name=name,
        arch=arch,
        model_cfg=model_cfg,
        pretrained_cfg=pretrained_cfg,
        quick_gelu=quick_gelu,
        preprocess=preprocess,
        text=text,
        local_dir=local_dir,
    )
