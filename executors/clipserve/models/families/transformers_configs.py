"""What clipserve reads from a transformers checkpoint's files: the model types it serves (with their image
processors' defaults), the folder's image processor as clipserve's preprocessing (refused where it cannot be
reproduced), and the tokenizer's context length and inputs. Torch-free: the model listing reads it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from clipserve.errors import UnknownModelError, WeightsUnavailableError
from clipserve.models.json_files import read_json_object
from clipserve.models.preprocess import PreprocessConfig

CONFIG_FILE = 'config.json'
PROCESSOR_FILE = 'preprocessor_config.json'
WEIGHTS_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin')


@dataclass(frozen=True)
class ModelType:
    """What clipserve needs to know of one transformers model type."""

    processor: dict  # the defaults of its image processor (what preprocessor_config.json may leave out)
    fixed_length: bool = False  # pools at a fixed position (SigLIP: the last one): never trimmed
    position_offset: int = 0  # positions a RoBERTa-style text tower reserves (pad id + 1)
    clean: str = 'none'  # TextSpec.clean: 'siglip2' as transformers' Siglip2Tokenizer (lowercase, left padding)


_CLIP_PROCESSOR = {
    'size': {'shortest_edge': 224},
    'crop_size': {'height': 224, 'width': 224},
    'do_center_crop': True,
    'resample': 3,
    'image_mean': [0.48145466, 0.4578275, 0.40821073],
    'image_std': [0.26862954, 0.26130258, 0.27577711],
}
MODEL_TYPES = {
    'clip': ModelType(_CLIP_PROCESSOR),
    'metaclip_2': ModelType(_CLIP_PROCESSOR),
    'chinese_clip': ModelType(_CLIP_PROCESSOR),
    'altclip': ModelType(_CLIP_PROCESSOR, position_offset=2),
    'siglip': ModelType(
        {
            'size': {'height': 224, 'width': 224},
            'do_center_crop': False,
            'resample': 3,
            'image_mean': [0.5, 0.5, 0.5],
            'image_std': [0.5, 0.5, 0.5],
        },
        fixed_length=True,
    ),
    # NaFlex: aspect-keeping resize to at most max_num_patches patches; Siglip2Tokenizer lowercases
    'siglip2': ModelType(
        {
            'patch_size': 16,
            'max_num_patches': 256,
            'resample': 2,
            'image_mean': [0.5, 0.5, 0.5],
            'image_std': [0.5, 0.5, 0.5],
        },
        fixed_length=True,
        clean='siglip2',
    ),
}
SIGMOID_TYPES = ('siglip', 'siglip2')  # text_config.hidden_size is their embedding size
# what a checkpoint without a known type (one with its own code) is preprocessed and padded as
_REMOTE_CODE = ModelType(_CLIP_PROCESSOR, fixed_length=True)
# PIL's resampling codes, as preprocessor_config.json writes them
_RESAMPLE = {0: 'nearest', 1: 'lanczos', 2: 'bilinear', 3: 'bicubic', 4: 'box', 5: 'hamming'}


def read_json(path: Path) -> dict:
    return read_json_object(path, WeightsUnavailableError)


def model_type_facts(kind: str) -> ModelType:
    return MODEL_TYPES.get(kind, _REMOTE_CODE)


def preprocess_config(folder: Path, kind: str) -> PreprocessConfig:
    """The folder's image processor as clipserve's preprocessing (refused where it cannot be reproduced)."""
    cfg = {**model_type_facts(kind).processor, **read_json(folder / PROCESSOR_FILE)}
    return processor_preprocess(cfg, str(folder / PROCESSOR_FILE), kind)


def processor_preprocess(cfg: dict, where: str, kind: str) -> PreprocessConfig:
    """An image processor's settings (`cfg`, from the file `where`) as clipserve's preprocessing."""
    if cfg.get('do_rescale', True) and abs(float(cfg.get('rescale_factor', 1 / 255)) - 1 / 255) > 1e-12:
        raise UnknownModelError(f'{where}: rescale_factor {cfg["rescale_factor"]} is not supported (only 1/255)')
    if not cfg.get('do_rescale', True) or not cfg.get('do_normalize', True) or not cfg.get('do_resize', True):
        raise UnknownModelError(f'{where}: do_resize, do_rescale and do_normalize must be on')
    resample = cfg.get('resample', 3)
    if resample not in _RESAMPLE:
        raise UnknownModelError(f'{where}: resample {resample!r} is not a PIL resampling filter')
    if kind == 'siglip2':
        return _naflex_config(cfg, _RESAMPLE[resample])
    size, crop = cfg.get('size') or {}, cfg.get('crop_size') or {}
    if isinstance(crop, int):
        crop = {'height': crop, 'width': crop}
    if 'shortest_edge' in size and cfg.get('do_center_crop'):
        if not (size['shortest_edge'] == crop.get('height') == crop.get('width')) or 'longest_edge' in size:
            raise UnknownModelError(
                f'{where}: only a shortest-edge resize to the crop size is supported, got {size}, {crop}'
            )
        image_size, mode = int(size['shortest_edge']), 'shortest'
    elif 'height' in size and size.get('height') == size.get('width'):
        if cfg.get('do_center_crop') and not (crop.get('height') == crop.get('width') == size['height']):
            raise UnknownModelError(f'{where}: a crop smaller than the resize is not supported, got {size}, {crop}')
        image_size, mode = int(size['height']), 'squash'
    else:
        raise UnknownModelError(f'{where}: size {size} is not supported (a square resize, or a shortest edge + crop)')
    return PreprocessConfig(
        image_size=image_size,
        mean=tuple(cfg['image_mean']),
        std=tuple(cfg['image_std']),
        interpolation=_RESAMPLE[resample],
        resize_mode=mode,
        crop='floor',
    )


def _naflex_config(cfg: dict, interpolation: str) -> PreprocessConfig:
    """SigLIP2's processor: image_size is nominal (the square of max_num_patches patches: warm-up, listings)."""
    patch, count = int(cfg['patch_size']), int(cfg['max_num_patches'])
    return PreprocessConfig(
        image_size=patch * max(1, math.isqrt(count)),
        mean=tuple(cfg['image_mean']),
        std=tuple(cfg['image_std']),
        interpolation=interpolation,
        resize_mode='naflex',
        patch_size=patch,
        max_num_patches=count,
    )


def text_facts(folder: Path, kind: str) -> tuple[int, list[str]]:
    """(context length, the inputs the tokenizer gives the model)."""
    config = read_json(folder / CONFIG_FILE)
    positions = int((config.get('text_config') or {}).get('max_position_embeddings') or 77)
    positions -= model_type_facts(kind).position_offset
    tokenizer = read_json(folder / 'tokenizer_config.json')
    context = min(int(tokenizer.get('model_max_length') or positions), positions)
    inputs = list(tokenizer.get('model_input_names') or ['input_ids', 'attention_mask'])
    return context, inputs
