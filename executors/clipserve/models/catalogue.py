"""Every model open_clip knows, and clip-as-service's M-CLIP and CN-CLIP ones, with the facts an operator
picks by: family, tokenizer, context length, embedding size, image size and resize mode, and which
backends serve it (`clipserve models`).

Read from open_clip's configs and pretrained registry without building any model. Importing open_clip takes
seconds, so the command line reads a snapshot of this module's answer (`catalogue.json`, through
known_models.py); `python -m clipserve.models.catalogue` rewrites it, and a unit test checks that it equals
what the installed open_clip says.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import open_clip

from clipserve.models.families import cnclip, late_interaction_files, mclip, transformers_configs
from clipserve.models.families import open_clip as open_clip_family
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.runtimes import BACKENDS
from clipserve.models.text_spec import BPE_TOKENIZER, TextSpec

# (substring of the architecture, lower case, family), first match wins
_ARCH_FAMILIES = (
    ('siglip2', 'SigLIP2'),
    ('siglip', 'SigLIP'),
    ('nllb', 'NLLB-CLIP'),
    ('worldwide', 'MetaCLIP 2'),
    ('xlm-roberta', 'XLM-R CLIP'),
    ('mt5', 'mT5 CLIP'),
    ('roberta', 'RoBERTa CLIP'),
    ('clipa', 'CLIPA'),
    ('pe-core', 'PE-Core'),
    ('mobileclip2', 'MobileCLIP2'),
    ('mobileclip', 'MobileCLIP'),
    ('coca', 'CoCa'),
    ('eva', 'EVA-CLIP'),
    ('vitamin', 'ViTamin'),
    ('convnext', 'ConvNeXt CLIP'),
    ('rn', 'ResNet CLIP'),
)
# (prefix of the pretrained tag, family) for ViT models whose family is their training data
_TAG_FAMILIES = (('dfn', 'DFN'), ('metaclip', 'MetaCLIP'), ('datacomp', 'DataComp'), ('commonpool', 'DataComp'))


def family(arch: str, tag: str) -> str:
    lower = arch.lower()
    for key, name in _ARCH_FAMILIES:
        if key in lower if key != 'rn' else lower.startswith('rn'):
            return name
    for prefix, name in _TAG_FAMILIES:
        if tag.lower().startswith(prefix):
            return name
    return 'CLIP'


@dataclass(frozen=True)
class ModelFacts:
    name: str
    family: str
    tokenizer: str
    context_length: int | None  # None: the checkpoint's own (transformers model types)
    embed_dim: int | None
    image_size: int | None
    resize_mode: str
    backends: str  # comma separated, or 'none: <why>'


def facts(arch: str, tag: str) -> ModelFacts:
    cfg = open_clip.get_model_config(arch)
    pretrained = open_clip.get_pretrained_cfg(arch, tag) if tag != 'random' else {}
    size = cfg['vision_cfg'].get('image_size', 224)
    preprocess = PreprocessConfig.from_open_clip({**pretrained, 'size': size})
    try:
        text = TextSpec.from_open_clip(cfg)
        tokenizer = 'open_clip BPE' if text.tokenizer == BPE_TOKENIZER else text.hf_tokenizer_name
        backends = ', '.join(BACKENDS)
        context = text.context_length
    except ValueError as e:
        tokenizer, backends, context = '?', f'none: {e}', 0
    return ModelFacts(
        name=f'{arch}::{tag}',
        family=family(arch, tag),
        tokenizer=tokenizer,
        context_length=context,
        embed_dim=int(cfg['embed_dim']),
        image_size=preprocess.image_size,
        resize_mode=preprocess.resize_mode,
        backends=backends,
    )


def clip_as_service_facts() -> list[ModelFacts]:
    """clip-as-service's M-CLIP and CN-CLIP models, by its names."""
    rows = []
    for name, model in mclip.MODELS.items():
        arch, _, tag = model.image_model.partition('::')
        image = facts(arch, tag)
        rows.append(
            ModelFacts(
                name=name,
                family='M-CLIP',
                tokenizer=model.repo,
                context_length=mclip.CONTEXT_LENGTH,
                embed_dim=model.embed_dim,
                image_size=image.image_size,
                resize_mode=image.resize_mode,
                backends=', '.join(BACKENDS),
            )
        )
    for name, model in cnclip.MODELS.items():
        config = cnclip.preprocess(model)
        rows.append(
            ModelFacts(
                name=name,
                family='CN-CLIP',
                tokenizer=cnclip.TEXT.hf_tokenizer_name,
                context_length=cnclip.CONTEXT_LENGTH,
                embed_dim=model.embed_dim,
                image_size=config.image_size,
                resize_mode=config.resize_mode,
                backends=', '.join(BACKENDS),
            )
        )
    return rows


def transformers_facts() -> list[ModelFacts]:
    """One row per transformers model type served (`transformers:<hub id or folder>`): the sizes are the
    checkpoint's own, so they read None here."""
    return [
        ModelFacts(
            name=f'transformers:<{kind} checkpoint>',
            family='transformers',
            tokenizer='its tokenizer.json',
            context_length=None,
            embed_dim=None,
            image_size=None,
            resize_mode='NaFlex patches' if kind == 'siglip2' else "its processor's",
            # NaFlex: a patch grid per image, which TensorRT's fixed image profiles do not take
            backends=', '.join(b for b in BACKENDS if not (kind == 'siglip2' and b == 'tensorrt')),
        )
        for kind in transformers_configs.MODEL_TYPES
    ]


def late_interaction_facts() -> list[ModelFacts]:
    """ColPali and ColQwen2 (`transformers:<hub id or folder>`): multi-vector, [tokens, dim] per text or image,
    on the torch backend (docs/late-interaction.md)."""
    return [
        ModelFacts(
            name=f'transformers:<{kind} checkpoint>',
            family=late_interaction_files.LATE_INTERACTION_FAMILY,
            tokenizer='its tokenizer.json',
            context_length=late_interaction_files.MAX_QUERY_TOKENS,
            embed_dim=None,
            image_size=None,
            resize_mode='[tokens, dim] out; ' + ('Qwen2-VL patches' if kind == 'colqwen2' else "its processor's"),
            backends='torch',
        )
        for kind in late_interaction_files.LATE_TYPES
    ]


def catalogue(include_random: bool = False) -> list[ModelFacts]:
    """One row per architecture and pretrained tag (and `::random` per architecture when asked), then
    clip-as-service's M-CLIP and CN-CLIP models, then the transformers model types."""
    rows = []
    for arch in open_clip_family.known_architectures():
        tags = list(open_clip.list_pretrained_tags_by_model(arch))
        if include_random or not tags:
            tags.append('random')
        rows += [facts(arch, tag) for tag in tags]
    return rows + clip_as_service_facts() + transformers_facts() + late_interaction_facts()


def as_dicts(rows: list[ModelFacts]) -> list[dict]:
    return [asdict(r) for r in rows]


SNAPSHOT = Path(__file__).with_name('catalogue.json')


def snapshot() -> dict:
    """What known_models.py reads: open_clip's version, every architecture with its pretrained tags, and the
    catalogue's rows (`::random` rows only for architectures without tags, as `clipserve models` shows them)."""
    architectures = {
        arch: list(open_clip.list_pretrained_tags_by_model(arch)) for arch in open_clip_family.known_architectures()
    }
    return {
        'open_clip': open_clip.__version__,
        'architectures': architectures,
        'external': {'M-CLIP': sorted(mclip.MODELS), 'CN-CLIP': sorted(cnclip.MODELS)},
        'rows': as_dicts(catalogue()),
    }


if __name__ == '__main__':
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=0, sort_keys=True) + '\n', encoding='utf-8')
    print(f'wrote {SNAPSHOT}')
