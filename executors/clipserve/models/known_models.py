"""The models clipserve knows, read from the catalogue's snapshot (catalogue.json) without importing open_clip or
torch: what `clipserve models` lists in a blink, and the check that refuses a mistyped model name in one line
before anything loads (`clipserve serve`, `clipserve embed`).

The check refuses only what the real resolution (models/registry.py) would refuse too: an architecture or a
pretrained tag open_clip does not have, an M-CLIP or CN-CLIP model clip-as-service did not have, a file or a
folder the name points at that is not there. Hub ids of transformers checkpoints cannot be checked offline and
pass; the model's own loading still judges them.
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

from clipserve.errors import UnknownModelError
from clipserve.models.names import (
    OPEN_CLIP_FAMILY,
    RANDOM_TAG,
    TRANSFORMERS_FAMILY,
    ModelName,
    parse_model_name,
)

SNAPSHOT = Path(__file__).with_name('catalogue.json')
LISTED_BY = '`clipserve models` lists them'


@functools.cache
def snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text(encoding='utf-8'))


def rows() -> list[dict]:
    """The catalogue's rows: name, family, tokenizer, context_length, embed_dim, image_size, resize_mode,
    backends."""
    return snapshot()['rows']


def _clean_tag(tag: str) -> str:
    return tag.lower().replace('-', '_')  # open_clip's spelling of pretrained tags


def _suggest(word: str, options, cutoff: float) -> str:
    """The closest options, ignoring case (`vit-b-32` is closest to `ViT-B-32`)."""
    by_lower = {option.lower(): option for option in options}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=5, cutoff=cutoff)
    return f' Did you mean: {", ".join(by_lower[c] for c in close)}?' if close else ''


def _looks_like_path(text: str) -> bool:
    return text.startswith(('/', './', '../', '~')) or '/' in text and Path(text).expanduser().exists()


def check_model_name(name: str | None) -> ModelName:
    """The parsed name, or an UnknownModelError naming what is wrong and what is close."""
    try:
        parsed = parse_model_name(name)
    except ValueError as error:
        raise UnknownModelError(str(error)) from None
    if parsed.local_dir is not None:
        if not Path(parsed.local_dir).expanduser().is_dir():
            raise UnknownModelError(f'model folder {parsed.local_dir!r} (from {str(parsed)!r}) does not exist')
        return parsed
    if parsed.family == TRANSFORMERS_FAMILY:
        source = parsed.transformers_source.strip()
        if _looks_like_path(source) and not Path(source).expanduser().is_dir():
            raise UnknownModelError(f'checkpoint folder {source!r} (from {str(parsed)!r}) does not exist')
        return parsed
    if parsed.family != OPEN_CLIP_FAMILY:
        known = snapshot()['external'][parsed.family]
        if parsed.arch not in known:
            hint = _suggest(parsed.arch, known, 0.5)
            raise UnknownModelError(f'unknown {parsed.family} model {parsed.arch!r}.{hint} Known: {", ".join(known)}')
        _check_weights_file(parsed)
        return parsed
    if parsed.config_path:
        if not Path(parsed.config_path).expanduser().is_file():
            raise UnknownModelError(f'architecture config file {parsed.config_path!r} does not exist')
        _check_weights_file(parsed)
        return parsed
    architectures = snapshot()['architectures']
    arch = parsed.arch.replace('/', '-')
    if arch not in architectures:
        hint = _suggest(arch, architectures, 0.5)
        raise UnknownModelError(
            f'unknown model architecture {parsed.arch!r} in {str(parsed)!r}.{hint} Names are "arch::pretrained" '
            f'(e.g. "ViT-B-32::openai"); {LISTED_BY}.'
        )
    if parsed.is_random or parsed.checkpoint_path:
        _check_weights_file(parsed)
        return parsed
    tags = architectures[arch]
    if _clean_tag(parsed.pretrained) not in {_clean_tag(t) for t in tags}:
        hint = _suggest(_clean_tag(parsed.pretrained), tags, 0.4)
        raise UnknownModelError(
            f'unknown pretrained weights {parsed.pretrained!r} for {arch!r}.{hint} Known tags for {arch}: '
            f'{", ".join(tags) or "none"}; or a checkpoint file (arch::/path/to/weights.safetensors) or '
            f'"{RANDOM_TAG}" (seeded random weights, no download).'
        )
    return parsed


def _check_weights_file(parsed: ModelName) -> None:
    path = parsed.checkpoint_path  # a file, or M-CLIP's folder of its repository's files
    if path and not Path(path).expanduser().exists():
        raise UnknownModelError(f'weights {path!r} (from {str(parsed)!r}) do not exist')
