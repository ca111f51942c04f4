"""Build an open_clip model with its weights: a pretrained tag, a local checkpoint or seeded random init.

Pretrained tags download through open_clip's own mechanism into clipserve's cache and load offline
from there afterwards. When a download is impossible the error says how to get going anyway.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from pathlib import Path

import open_clip
import torch
from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME
from open_clip.factory import _set_model_device_and_precision as set_device_and_precision

from clipserve.errors import BackendUnavailableError, WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.hf_tokenizer import TOKENIZER_FILE, TOKENIZER_FILES
from clipserve.models.hub import why_no_download
from clipserve.models.names import OPEN_CLIP_FAMILY
from clipserve.models.registry import ResolvedModel, family_module

RANDOM_SEED = 0
# the weights file of a local-dir folder, in open_clip's order of preference
LOCAL_DIR_WEIGHTS = (
    'open_clip_model.safetensors',
    'open_clip_pytorch_model.safetensors',
    'open_clip_pytorch_model.bin',
    'open_clip_pytorch_model.pth',
    'model.safetensors',
    'pytorch_model.bin',
)
PRECISIONS = {'fp32': 'fp32', 'fp16': 'fp16', 'bf16': 'bf16'}
TORCH_DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}

logger = logging.getLogger(__name__)


def _hub_files(cfg: dict) -> tuple[str, list[str]]:
    """(repo id, candidate file names) of a tag's Hugging Face copy, safetensors first, as open_clip asks."""
    repo, filename = os.path.split(cfg['hf_hub'])
    filename = filename or HF_WEIGHTS_NAME
    names = [HF_SAFE_WEIGHTS_NAME] if filename == HF_WEIGHTS_NAME else []
    if filename.endswith(('.bin', '.pth')) and filename != HF_WEIGHTS_NAME:
        names.append(filename.rsplit('.', 1)[0] + '.safetensors')
    return repo, names + [filename]


def cached_weights(cfg: dict, target: Path) -> str | None:
    """The tag's weights if the cache already holds them; touches no network."""
    if not cfg.get('hf_hub'):
        return None
    from huggingface_hub import try_to_load_from_cache

    repo, names = _hub_files(cfg)
    for name in names:
        path = try_to_load_from_cache(repo_id=repo, filename=name, cache_dir=str(target))
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None


def _unavailable(resolved: ResolvedModel, target: Path, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f'cannot get the weights of {resolved.name}: {why}. '
        f'They download on first use into the cache {str(target)!r} (set ${CACHE_ENV} to move it), '
        'and that needs network access. Offline, either copy a cache that has them, '
        f'or load a local checkpoint file with "{resolved.arch}::/path/to/weights.safetensors" '
        f'(.safetensors, .bin or .pt), or use "{resolved.arch}::random" (random weights) for smoke runs.'
    )


def download_weights(resolved: ResolvedModel) -> str:
    """The local path of the tag's weights: from the cache when there, else downloaded into it."""
    target = cache_dir()
    cfg = resolved.pretrained_cfg
    cached = cached_weights(cfg, target)
    if cached:
        return cached
    from huggingface_hub import constants

    why = why_no_download(constants.ENDPOINT if cfg.get('hf_hub') else cfg.get('url', ''))
    if why:
        raise _unavailable(resolved, target, why)
    try:
        target.mkdir(parents=True, exist_ok=True)
        path = open_clip.download_pretrained(cfg, cache_dir=str(target))
    except Exception as e:  # network, hub and file-system errors all end here
        raise _unavailable(resolved, target, f'{type(e).__name__}: {e}') from e
    if not path or not os.path.isfile(path):
        raise _unavailable(resolved, target, 'the download left no file')
    return path


def _local_dir_weights(folder: Path) -> str:
    for name in LOCAL_DIR_WEIGHTS:
        if (folder / name).is_file():
            return str(folder / name)
    raise WeightsUnavailableError(
        f"model folder {str(folder)!r} has no weights file: copy the model's weights there as one of "
        f'{", ".join(LOCAL_DIR_WEIGHTS)}'
    )


def _checkpoint_path(resolved: ResolvedModel) -> str | None:
    if resolved.local_dir is not None:
        return _local_dir_weights(resolved.local_dir)
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


def build_model(resolved: ResolvedModel, device: str = 'cpu', precision: str = 'fp32') -> torch.nn.Module:
    """An eval-mode open_clip model on `device`, in `precision`, with the weights `resolved` names.

    Peak memory is one copy of the weights: a checkpoint's tensors are loaded once and become the
    model's parameters (on a GPU, each is moved and its CPU copy freed in turn).
    """
    if resolved.family != OPEN_CLIP_FAMILY:
        return family_module(resolved.family).build(resolved, device, precision)
    _require_text_tower_runtime(resolved)
    checkpoint = _checkpoint_path(resolved)
    kwargs = dict(force_quick_gelu=resolved.quick_gelu, pretrained_text=False, pretrained_image=False)
    if checkpoint is None:
        # Seeded, and without disturbing the caller's random state: the same name gives the
        # same weights in every process, which is what cross-backend parity tests rely on.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(RANDOM_SEED)
            model = open_clip.create_model(
                resolved.arch, pretrained=None, precision=PRECISIONS[precision], device=device, **kwargs
            )
    else:
        try:
            with _parameters_on_meta():
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


def _tokenizer_unavailable(resolved: ResolvedModel, repo: str, target: Path, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f'cannot get the tokenizer files of {resolved.name} ({repo}): {why}. They download on first use into '
        f'the cache {str(target)!r} (set ${CACHE_ENV} to move it), which needs network access. Offline, copy a cache '
        f'that has them, or serve a local folder "local-dir:/path" holding open_clip_config.json, the weights and '
        f'the tokenizer files ({", ".join(TOKENIZER_FILES[:3])}) of {repo}'
    )


def tokenizer_folder(resolved: ResolvedModel) -> Path | None:
    """The folder holding the model's Hugging Face tokenizer files (None for open_clip's BPE models):
    the local-dir folder, a checkpoint's own folder when it has them, else the cache (downloading once)."""
    if not resolved.text.needs_tokenizer_files:
        return None
    if resolved.family != OPEN_CLIP_FAMILY:
        return family_module(resolved.family).tokenizer_folder(resolved)
    local = [resolved.local_dir]
    if resolved.name.checkpoint_path:
        local.append(Path(resolved.name.checkpoint_path).expanduser().parent)
    for folder in local:
        if folder is not None and (folder / TOKENIZER_FILE).is_file():
            return folder
    if resolved.local_dir is not None:
        raise WeightsUnavailableError(
            f'model folder {str(resolved.local_dir)!r} has no {TOKENIZER_FILE}: copy the tokenizer files of '
            f'{resolved.text.hf_tokenizer_name or "the model"} ({", ".join(TOKENIZER_FILES[:3])}) there'
        )
    repo = resolved.text.hf_tokenizer_name
    target = cache_dir()
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id=repo, filename=TOKENIZER_FILE, cache_dir=str(target))
    if isinstance(cached, str) and os.path.isfile(cached):
        return Path(cached).parent
    from huggingface_hub import constants

    why = why_no_download(constants.ENDPOINT)
    if why:
        raise _tokenizer_unavailable(resolved, repo, target, why)
    try:
        folder = Path(snapshot_download(repo_id=repo, allow_patterns=list(TOKENIZER_FILES), cache_dir=str(target)))
    except Exception as e:  # network, hub and file-system errors all end here
        raise _tokenizer_unavailable(resolved, repo, target, f'{type(e).__name__}: {e}') from e
    if not (folder / TOKENIZER_FILE).is_file():
        raise _tokenizer_unavailable(resolved, repo, target, f'the repository has no {TOKENIZER_FILE}')
    return folder
