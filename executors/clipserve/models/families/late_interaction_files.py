"""Late-interaction checkpoints (ColPali, ColQwen2) in transformers' format: what clipserve reads from their files
(torch-free; late_interaction.py builds the models).

`transformers:<hub id or folder>` whose config.json's model_type is `colpali` (transformers' ColPaliForRetrieval:
PaliGemma's SigLIP + Gemma) or `colqwen2` (ColQwen2ForRetrieval: Qwen2-VL). Each embeds a page image and a
query as one 128-d unit vector per token (a multi-vector embedding, [tokens, dim]), scored by MaxSim
(engine/ranking.py). Everything the processors do is reproduced here from the checkpoint's files, torch-free:

- images: ColPali resizes to the processor's square (SigLIP's processor) and runs the model on
  `<image> x image_seq_length + <bos> + visual_prompt_prefix + '\\n'`; ColQwen2 resizes with Qwen2-VL's
  `smart_resize` into patches (qwen2_patches.py) and runs `visual_prompt_prefix` with its one
  `<|image_pad|>` expanded to the image's (rows x columns) / merge_size**2 tokens;
- queries: `[<bos>] + query_prefix + text + pad_token x 10 + '\\n'` (query_tokenizer.py);
- the processor's settings come from processor_config.json (`visual_prompt_prefix`, `query_prefix` and, as
  transformers 5 saves it, the image processor) and preprocessor_config.json (as transformers 4 saves it),
  over the processor classes' defaults.

An image's output always has `image_tokens` rows (the most an image can have; a ColQwen2 page with fewer
tokens has zero rows after its own): the pipeline stacks pages, and drops the zero rows per document.
The model types' facts live here, apart from transformers_configs.py's CLIP-family ones: their outputs are
multi-vector, and only the torch backend serves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clipserve.errors import UnknownModelError, WeightsUnavailableError
from clipserve.models import qwen2_patches
from clipserve.models.families.transformers_configs import CONFIG_FILE, PROCESSOR_FILE, processor_preprocess
from clipserve.models.hf_tokenizer import TOKENIZER_FILE, special_tokens
from clipserve.models.json_files import read_json_object
from clipserve.models.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig

LATE_INTERACTION_FAMILY = 'late-interaction'  # ResolvedModel.family: models/families/late_interaction.py builds them
PROCESSOR_CONFIG_FILE = 'processor_config.json'
MAX_QUERY_TOKENS = 256  # a query's tokens at most, prompt included (the processors never truncate; a server must)
AUGMENTATION_TOKENS = 10  # pad tokens after each query (the processors' query augmentation)


@dataclass(frozen=True)
class LateType:
    """One late-interaction model type: transformers' class, and its processor's defaults."""

    model_class: str
    image_processor: dict
    visual_prompt_prefix: str
    query_prefix: str
    image_token: str
    bos_before_query: bool  # ColPali's queries start with <bos>


LATE_TYPES = {
    'colpali': LateType(
        'ColPaliForRetrieval',
        {'size': {'height': 224, 'width': 224}, 'resample': 3, 'image_mean': [0.5] * 3, 'image_std': [0.5] * 3},
        'Describe the image.',
        'Question: ',
        '<image>',
        bos_before_query=True,
    ),
    'colqwen2': LateType(
        'ColQwen2ForRetrieval',
        {
            'size': {'shortest_edge': 56 * 56, 'longest_edge': 28 * 28 * 1280},
            'patch_size': 14,
            'merge_size': 2,
            'temporal_patch_size': 2,
            'resample': 3,
            'image_mean': list(OPENAI_MEAN),
            'image_std': list(OPENAI_STD),
        },
        '<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>',
        'Query: ',
        '<|image_pad|>',
        bos_before_query=False,
    ),
}


@dataclass(frozen=True)
class ImagePrompt:
    """An image's token ids: `prefix_ids`, then `image_token_id` once per image token, then `suffix_ids`."""

    prefix_ids: tuple[int, ...]
    image_token_id: int
    suffix_ids: tuple[int, ...]
    pad_id: int  # fills a batch's shorter rows (masked)

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def _read(path: Path) -> dict:
    return read_json_object(path, WeightsUnavailableError)


def is_late_interaction(kind: str | None) -> bool:
    return kind in LATE_TYPES


def processor_settings(folder: Path, kind: str) -> tuple[dict, dict]:
    """(the processor's own settings, its image processor's): the defaults, then processor_config.json (with the
    image processor nested, as transformers 5 saves it), then preprocessor_config.json (transformers 4)."""
    processor = _read(folder / PROCESSOR_CONFIG_FILE)
    image = {**LATE_TYPES[kind].image_processor, **(processor.get('image_processor') or {})}
    image.update(_read(folder / PROCESSOR_FILE))
    return processor, image


def _qwen2_preprocess(cfg: dict, where: str) -> PreprocessConfig:
    """Qwen2-VL's image processor: `size` {shortest_edge: min_pixels, longest_edge: max_pixels}, which top-level
    min_pixels / max_pixels override (as its constructor does)."""
    size = dict(cfg.get('size') or {})
    low = cfg.get('min_pixels') or size.get('shortest_edge') or size.get('min_pixels')
    high = cfg.get('max_pixels') or size.get('longest_edge') or size.get('max_pixels')
    if not (low and high):
        raise UnknownModelError(f'{where}: size {size} has no shortest_edge / longest_edge (min and max pixels)')
    patch, merge = int(cfg['patch_size']), int(cfg['merge_size'])
    if int(cfg.get('temporal_patch_size', 2)) < 1:
        raise UnknownModelError(f'{where}: temporal_patch_size must be positive')
    # its rescaling, normalisation and resampling, checked as any image processor's
    base = processor_preprocess(
        {**cfg, 'size': {'height': patch, 'width': patch}, 'do_center_crop': False}, where, 'siglip'
    )
    return PreprocessConfig(
        image_size=int(round((int(high) ** 0.5) / (patch * merge))) * patch * merge or patch * merge,
        mean=base.mean,
        std=base.std,
        interpolation=base.interpolation,
        resize_mode='qwen2',
        crop='floor',
        patch_size=patch,
        max_num_patches=qwen2_patches.max_patches(patch, merge, int(high)),
        merge_size=merge,
        pixel_range=(int(low), int(high)),
    )


def preprocess(folder: Path, kind: str) -> PreprocessConfig:
    """The checkpoint's image processor as clipserve's preprocessing (refused where it cannot be reproduced)."""
    _, cfg = processor_settings(folder, kind)
    where = f'{folder}: the image processor'
    if kind == 'colqwen2':
        return _qwen2_preprocess(cfg, where)
    return processor_preprocess(cfg, where, 'siglip')


def _tokenizer(folder: Path):
    from tokenizers import Tokenizer

    if not (folder / TOKENIZER_FILE).is_file():
        raise WeightsUnavailableError(f'{str(folder)!r} has no {TOKENIZER_FILE}, which the processor needs')
    return Tokenizer.from_file(str(folder / TOKENIZER_FILE))


def _special(folder: Path, name: str) -> str:
    token = special_tokens(folder).get(name)
    if token is None:
        raise UnknownModelError(f'{str(folder)!r}: the tokenizer has no {name}, which the processor uses')
    return token


def query_prompt(folder: Path, kind: str) -> tuple[str, str]:
    """(prefix, suffix) each query is wrapped in, as the processor's process_queries writes it."""
    processor, _ = processor_settings(folder, kind)
    late = LATE_TYPES[kind]
    prefix = processor.get('query_prefix') or late.query_prefix
    if late.bos_before_query:
        prefix = _special(folder, 'bos_token') + prefix
    return prefix, _special(folder, 'pad_token') * AUGMENTATION_TOKENS + '\n'


def image_prompt(folder: Path, kind: str, config: dict) -> tuple[ImagePrompt, int | None]:
    """The tokens around an image's (prefix, image tokens, suffix), and ColPali's fixed image_seq_length."""
    processor, image_cfg = processor_settings(folder, kind)
    late = LATE_TYPES[kind]
    visual = processor.get('visual_prompt_prefix') or late.visual_prompt_prefix
    token = special_tokens(folder).get('image_token') or late.image_token
    tokenizer = _tokenizer(folder)
    image_id = tokenizer.token_to_id(token)
    expected = (config.get('vlm_config') or {}).get(
        'image_token_id', (config.get('vlm_config') or {}).get('image_token_index')
    )
    if image_id is None or (expected is not None and int(expected) != image_id):
        raise UnknownModelError(
            f'{str(folder)!r}: the image token {token!r} is id {image_id} in the tokenizer but '
            f'{expected} in config.json; the processor and the model disagree'
        )
    pad_id = tokenizer.token_to_id(_special(folder, 'pad_token'))
    if kind == 'colpali':
        length = image_cfg.get('image_seq_length') or processor.get('image_seq_length')
        if not length:
            raise UnknownModelError(f'{str(folder)!r}: the image processor has no image_seq_length')
        text = f'{_special(folder, "bos_token")}{visual}\n'
        suffix = tokenizer.encode(text, add_special_tokens=False).ids
        return ImagePrompt((), image_id, tuple(suffix), pad_id), int(length)
    ids = tokenizer.encode(visual, add_special_tokens=False).ids
    if ids.count(image_id) != 1:
        raise UnknownModelError(f'{str(folder)!r}: visual_prompt_prefix must hold {token!r} once, got {visual!r}')
    at = ids.index(image_id)
    return ImagePrompt(tuple(ids[:at]), image_id, tuple(ids[at + 1 :]), pad_id), None


def query_context(folder: Path, config: dict) -> int:
    """The most tokens a query may have: MAX_QUERY_TOKENS, the tokenizer's limit and the text positions."""
    tokenizer = _read(folder / 'tokenizer_config.json')
    text = (config.get('vlm_config') or {}).get('text_config') or {}
    limits = [MAX_QUERY_TOKENS, int(tokenizer.get('model_max_length') or MAX_QUERY_TOKENS)]
    limits.append(int(text.get('max_position_embeddings') or MAX_QUERY_TOKENS))
    return min(limits)


def image_tokens(prompt: ImagePrompt, config: PreprocessConfig, image_seq_length: int | None) -> int:
    """The rows of an image's output: the prompt's tokens and the most image tokens an image can have."""
    if image_seq_length is not None:
        count = image_seq_length
    else:
        count = config.max_num_patches // (config.merge_size * config.merge_size)
    return len(prompt.prefix_ids) + count + len(prompt.suffix_ids)


def embedding_dim(folder: Path) -> int:
    return int(_read(folder / CONFIG_FILE).get('embedding_dim') or 128)
