"""open_clip's models (`arch::pretrained`, checkpoint files, `local-dir:` folders, `::random`): resolved
against open_clip's config and pretrained registries plus clipserve's bundled configs, and built with
open_clip's own code. The M-CLIP family reuses `resolve` and `build` for its image towers.

Weights load in place (one copy at peak); where that fails, the way open_clip does it (two copies).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from pathlib import Path

import open_clip
import torch
from open_clip.factory import _set_model_device_and_precision as set_device_and_precision

from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.cache import cache_dir
from clipserve.models.families import open_clip_files
from clipserve.models.names import OPEN_CLIP_FAMILY, ModelName
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.resolved import ResolvedModel
from clipserve.models.text_spec import TextSpec

FAMILY = OPEN_CLIP_FAMILY
LOCAL_CONFIG_FILE = 'open_clip_config.json'  # open_clip's local-dir / hf-hub layout
BUNDLED_CONFIGS = Path(__file__).resolve().parents[1] / 'configs'
open_clip.add_model_config(BUNDLED_CONFIGS)

RANDOM_SEED = 0
PRECISIONS = {'fp32': 'fp32', 'fp16': 'fp16', 'bf16': 'bf16'}  # clipserve's names -> open_clip's

logger = logging.getLogger(__name__)


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
            'Names are "arch::pretrained" (e.g. "ViT-B-32::openai"); `clipserve models` lists them.'
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


def resolve(name: ModelName) -> ResolvedModel:
    """Check that `name` can be built and gather its config, without loading any weights."""
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


@contextlib.contextmanager
def _parameters_on_meta():
    """Create every nn.Parameter on the meta device (no memory, no random init); buffers stay real.

    Buffers that no checkpoint holds (open_clip's causal `attn_mask`) are built as usual, while the
    weights are left for the checkpoint to fill: the model's weights exist once, not twice.
    It patches nn.Module for the duration, so no other thread may build modules meanwhile (a replica
    builds its model once, at start, before serving).
    """
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != 'meta':
            module._parameters[name] = torch.nn.Parameter(param.to('meta'), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _load_in_place(model: torch.nn.Module, checkpoint: str) -> None:
    """open_clip's checkpoint loading (format detection, key conversions, strict check), with the
    checkpoint's tensors becoming the parameters instead of being copied into a second set."""
    model.load_state_dict = functools.partial(type(model).load_state_dict, model, assign=True)
    try:
        open_clip.load_checkpoint(model, checkpoint, strict=True)
    finally:
        del model.load_state_dict
    left = [name for name, p in model.named_parameters() if p.device.type == 'meta']
    if left:
        raise RuntimeError(f'the checkpoint has no values for {", ".join(left[:5])}')


def _load_as_open_clip_does(
    resolved: ResolvedModel, checkpoint: str, device: str, precision: str, kwargs: dict
) -> torch.nn.Module:
    try:
        return open_clip.create_model(
            resolved.arch, pretrained=checkpoint, precision=PRECISIONS[precision], device=device, **kwargs
        )
    except Exception as e:  # open_clip raises RuntimeError, AssertionError, KeyError... for a bad file
        raise WeightsUnavailableError(
            f'the checkpoint {checkpoint!r} does not fit the architecture {resolved.arch!r} '
            f'or cannot be read ({type(e).__name__}: {e})'
        ) from e


def _require_text_tower_runtime(resolved: ResolvedModel) -> None:
    """A Hugging Face text tower (XLM-R, mT5, NLLB, ...) is built by transformers, which the torch extra
    leaves out: say so before open_clip fails on the import with its own message."""
    tower = resolved.model_cfg.get('text_cfg', {}).get('hf_model_name')
    if tower and importlib.util.find_spec('transformers') is None:
        raise BackendUnavailableError(
            f'{resolved.name} has a Hugging Face text tower ({tower}), which the torch backend builds with '
            f"transformers: pip install 'clipserve[hf-text]' (or export it once and serve the ONNX files, "
            'which need neither torch nor transformers)'
        )


@contextlib.contextmanager
def _without_random_init_notice():
    """open_clip logs "No pretrained weights loaded ... Model initialized randomly" on the root logger (and so
    configures it, printing `WARNING:root:...`) whenever it builds a model without weights: here that is on
    purpose (`::random`, or a checkpoint loaded right after), so that one record is dropped and the root logger
    left as it was."""
    root = logging.getLogger()

    def notice(record) -> bool:
        return not str(record.msg).startswith('No pretrained weights loaded')

    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)  # a handler there: logging.warning() does not call basicConfig()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)
        if placeholder is not None:
            root.removeHandler(placeholder)


def build(resolved: ResolvedModel, device: str = 'cpu', precision: str = 'fp32') -> torch.nn.Module:
    """An eval-mode open_clip model on `device`, in `precision`, with the weights `resolved` names.

    Peak memory is one copy of the weights: a checkpoint's tensors are loaded once and become the
    model's parameters (on a GPU, each is moved and its CPU copy freed in turn).
    """
    _require_text_tower_runtime(resolved)
    checkpoint = open_clip_files.checkpoint_path(resolved)
    kwargs = dict(force_quick_gelu=resolved.quick_gelu, pretrained_text=False, pretrained_image=False)
    if checkpoint is None:
        # Seeded, and without disturbing the caller's random state: the same name gives the
        # same weights in every process, which is what cross-backend parity tests rely on.
        with torch.random.fork_rng(devices=[]), _without_random_init_notice():
            torch.manual_seed(RANDOM_SEED)
            model = open_clip.create_model(
                resolved.arch, pretrained=None, precision=PRECISIONS[precision], device=device, **kwargs
            )
    else:
        try:
            with _parameters_on_meta(), _without_random_init_notice():
                # device=None: leave the (meta) parameters where they are; precision after loading
                model = open_clip.create_model(resolved.arch, pretrained=None, precision='fp32', device=None, **kwargs)
            _load_in_place(model, checkpoint)
            # open_clip's own device and precision step (as create_model does it; pinned by constraints.txt)
            set_device_and_precision(
                model,
                torch.device(device),
                PRECISIONS[precision],
                'timm_model_name' in resolved.model_cfg.get('vision_cfg', {}),
            )
        except Exception as e:
            # An architecture whose construction does not survive meta parameters still loads the
            # way open_clip does it (two copies at peak); a checkpoint that fits nothing fails there too.
            logger.warning(
                'loading %s in place failed (%s: %s); loading it as open_clip does', checkpoint, type(e).__name__, e
            )
            model = _load_as_open_clip_does(resolved, checkpoint, device, precision, kwargs)
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    logger.info('loaded %s (%s) on %s in %s', resolved.name, checkpoint or 'random init', device, precision)
    return model


def tokenizer_folder(resolved: ResolvedModel) -> Path:
    """The folder holding the model's Hugging Face tokenizer files (open_clip_files.py says where from)."""
    return open_clip_files.tokenizer_folder(resolved)
