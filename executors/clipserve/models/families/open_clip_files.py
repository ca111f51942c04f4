"""Where an open_clip model's files come from: a pretrained tag's weights through clipserve's cache (found
there offline, downloaded once otherwise), a checkpoint file, a `local-dir:` folder, and the Hugging Face
tokenizer files of the models that have them. When a file cannot be had, the error says how to get going
anyway (copy a cache, a local checkpoint, `::random`, a `local-dir:` folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

from clipserve.errors import WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.hf_tokenizer import TOKENIZER_FILE, TOKENIZER_FILES
from clipserve.models.hub import HubFileUnavailable, hub_file, hub_snapshot
from clipserve.models.resolved import ResolvedModel

# the weights file of a local-dir folder, in open_clip's order of preference
LOCAL_DIR_WEIGHTS = (
    'open_clip_model.safetensors',
    'open_clip_pytorch_model.safetensors',
    'open_clip_pytorch_model.bin',
    'open_clip_pytorch_model.pth',
    'model.safetensors',
    'pytorch_model.bin',
)


def hub_files(cfg: dict) -> tuple[str, list[str]]:
    """(repo id, candidate file names) of a tag's Hugging Face copy, safetensors first, as open_clip asks."""
    repo, filename = os.path.split(cfg['hf_hub'])
    filename = filename or HF_WEIGHTS_NAME
    names = [HF_SAFE_WEIGHTS_NAME] if filename == HF_WEIGHTS_NAME else []
    if filename.endswith(('.bin', '.pth')) and filename != HF_WEIGHTS_NAME:
        names.append(filename.rsplit('.', 1)[0] + '.safetensors')
    return repo, names + [filename]


def _unavailable(resolved: ResolvedModel, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f'cannot get the weights of {resolved.name}: {why}. '
        f'They download on first use into the cache {str(cache_dir())!r} (set ${CACHE_ENV} to move it), '
        'and that needs network access. Offline, either copy a cache that has them, '
        f'or load a local checkpoint file with "{resolved.arch}::/path/to/weights.safetensors" '
        f'(.safetensors, .bin or .pt), or use "{resolved.arch}::random" (random weights) for smoke runs.'
    )


def download_weights(resolved: ResolvedModel) -> str:
    """The local path of the tag's weights: from the cache when there, else downloaded into it."""
    cfg = resolved.pretrained_cfg
    if not cfg.get('hf_hub'):  # every tag of open_clip 3 has a Hugging Face copy
        raise _unavailable(resolved, 'its pretrained entry names no Hugging Face repository')
    repo, names = hub_files(cfg)
    try:
        return str(hub_file(repo, names))
    except HubFileUnavailable as e:
        raise _unavailable(resolved, str(e)) from e


def _local_dir_weights(folder: Path) -> str:
    for name in LOCAL_DIR_WEIGHTS:
        if (folder / name).is_file():
            return str(folder / name)
    raise WeightsUnavailableError(
        f"model folder {str(folder)!r} has no weights file: copy the model's weights there as one of "
        f'{", ".join(LOCAL_DIR_WEIGHTS)}'
    )


def checkpoint_path(resolved: ResolvedModel) -> str | None:
    """The weights file to load: the local-dir folder's, the name's checkpoint file, or the tag's (cached
    or downloaded); None for `::random`."""
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


def _tokenizer_unavailable(resolved: ResolvedModel, repo: str, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f'cannot get the tokenizer files of {resolved.name} ({repo}): {why}. They download on first use into '
        f'the cache {str(cache_dir())!r} (set ${CACHE_ENV} to move it), which needs network access. Offline, copy '
        f'a cache that has them, or serve a local folder "local-dir:/path" holding open_clip_config.json, the '
        f'weights and the tokenizer files ({", ".join(TOKENIZER_FILES[:3])}) of {repo}'
    )


def tokenizer_folder(resolved: ResolvedModel) -> Path:
    """The folder holding the model's Hugging Face tokenizer files: the local-dir folder, a checkpoint's
    own folder when it has them, else the cache (downloading once)."""
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
    try:
        return hub_snapshot(repo, list(TOKENIZER_FILES), required=TOKENIZER_FILE)
    except HubFileUnavailable as e:
        raise _tokenizer_unavailable(resolved, repo, str(e)) from e
