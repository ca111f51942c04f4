"""Multilingual-CLIP (M-CLIP) by clip-as-service's four names: a multilingual text tower trained to match
an OpenAI/open_clip image tower.

The text tower is what the `multilingual-clip` package defines: a Hugging Face transformer (XLM-R
large or LaBSE), mean pooling of its last hidden states over the attention mask, then one linear
layer (`LinearTransformation`) into the image tower's space. Its files are the M-CLIP repository's
(`config.json` naming `modelBase`, `transformerDimensions` and `numDims`, the weights and the
tokenizer); the transformer's own shape comes from `modelBase`'s `config.json`. Texts are tokenized
as clip-as-service did (truncated to 77 tokens, no cleaning); padding never reaches the pooled
vector, so batches run only up to their longest text.

The image tower is the open_clip model clip-as-service paired with each name, built, cached and
preprocessed like any other open_clip model.

    M-CLIP/XLM-Roberta-Large-Vit-B-32          the published weights (cached, downloaded once)
    M-CLIP/XLM-Roberta-Large-Vit-B-32::/path   a local copy of the M-CLIP repository's files
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.dtypes import TORCH_DTYPES
from clipserve.models.families import open_clip as open_clip_family
from clipserve.models.hf_tokenizer import TOKENIZER_FILE, TOKENIZER_FILES
from clipserve.models.hub import HubFileUnavailable, hub_file, hub_snapshot
from clipserve.models.json_files import read_json_object
from clipserve.models.names import MCLIP_FAMILY, ModelName, parse_model_name
from clipserve.models.resolved import ResolvedModel
from clipserve.models.text_spec import HF_TOKENIZER, TextSpec

FAMILY = MCLIP_FAMILY
CONTEXT_LENGTH = 77  # clip-as-service's max_length for M-CLIP (the package itself never truncates)
CONFIG_FILE = 'config.json'
WEIGHTS_FILES = ('model.safetensors', 'pytorch_model.bin')
BASE_CONFIG = 'base_config.json'  # modelBase's config.json, when a local folder carries it


@dataclass(frozen=True)
class MclipModel:
    repo: str  # the Hugging Face repository of the text tower
    image_model: str  # the open_clip model clip-as-service paired it with
    embed_dim: int


MODELS = {
    'M-CLIP/XLM-Roberta-Large-Vit-B-32': MclipModel('M-CLIP/XLM-Roberta-Large-Vit-B-32', 'ViT-B-32::openai', 512),
    'M-CLIP/XLM-Roberta-Large-Vit-L-14': MclipModel('M-CLIP/XLM-Roberta-Large-Vit-L-14', 'ViT-L-14::openai', 768),
    'M-CLIP/XLM-Roberta-Large-Vit-B-16Plus': MclipModel(
        'M-CLIP/XLM-Roberta-Large-Vit-B-16Plus', 'ViT-B-16-plus-240::laion400m_e31', 640
    ),
    'M-CLIP/LABSE-Vit-L-14': MclipModel('M-CLIP/LABSE-Vit-L-14', 'ViT-L-14::openai', 768),
}


def text_spec(repo: str) -> TextSpec:
    return TextSpec(
        tokenizer=HF_TOKENIZER, context_length=CONTEXT_LENGTH, clean='none', causal=True, hf_tokenizer_name=repo
    )


def lookup(name: ModelName) -> MclipModel:
    model = MODELS.get(name.arch)
    if model is None:
        raise UnknownModelError(
            f'unknown Multilingual-CLIP model {name.arch!r}; known: {", ".join(MODELS)} '
            '(`python -m clipserve models --family M-CLIP`)'
        )
    return model


def resolve(name: ModelName) -> ResolvedModel:
    """The M-CLIP model's facts; its image tower resolves as the open_clip model it names."""
    model = lookup(name)
    if name.is_random:
        raise UnknownModelError(
            f'{name.arch} has no "::random": its text tower takes its shape from its files; give them with '
            f'"{name.arch}::/path/to/folder"'
        )
    image = open_clip_family.resolve(parse_model_name(model.image_model))
    return ResolvedModel(
        name=name,
        arch=name.arch,
        model_cfg={'embed_dim': model.embed_dim},
        pretrained_cfg={'hf_hub': model.repo},
        quick_gelu=False,
        preprocess=image.preprocess,
        text=text_spec(model.repo),
        family=MCLIP_FAMILY,
        image_model=image,
    )


def _unavailable(resolved, why: str) -> WeightsUnavailableError:
    repo = resolved.text.hf_tokenizer_name
    return WeightsUnavailableError(
        f'cannot get the text tower of {resolved.name} ({repo}): {why}. It downloads on first use into the '
        f'cache {str(cache_dir())!r} (set ${CACHE_ENV} to move it), which needs network access. Offline, copy '
        f'a cache that has it, or copy the files of {repo} ({CONFIG_FILE}, the weights, {TOKENIZER_FILE}) and '
        f'its modelBase\'s config.json (as {BASE_CONFIG}) into a folder and serve "{resolved.arch}::/path/to/folder"'
    )


def text_folder(resolved) -> Path:
    """The folder with the M-CLIP repository's files: the one the name gives, else the cache (downloaded once)."""
    local = resolved.name.checkpoint_path
    if local is not None:
        folder = Path(local).expanduser()
        missing = [n for n in (CONFIG_FILE, TOKENIZER_FILE) if not (folder / n).is_file()]
        if not folder.is_dir() or missing:
            raise WeightsUnavailableError(
                f'{str(folder)!r} (from {str(resolved.name)!r}) is not an M-CLIP folder: it needs '
                f'{CONFIG_FILE}, {" or ".join(WEIGHTS_FILES)} and {TOKENIZER_FILE} (the files of '
                f'{resolved.text.hf_tokenizer_name})'
            )
        return folder
    patterns = [CONFIG_FILE, *WEIGHTS_FILES, *TOKENIZER_FILES]
    try:
        return hub_snapshot(resolved.text.hf_tokenizer_name, patterns, required=CONFIG_FILE)
    except HubFileUnavailable as e:
        raise _unavailable(resolved, str(e)) from e


def tokenizer_folder(resolved) -> Path:
    """The tokenizer files come with the text tower's: the same folder."""
    return text_folder(resolved)


def _read_json(path: Path) -> dict:
    return read_json_object(path, WeightsUnavailableError, missing_ok=False)


def base_config_file(resolved, folder: Path) -> Path:
    """modelBase's config.json: beside the files, at modelBase when it is a folder, else from the hub."""
    if (folder / BASE_CONFIG).is_file():
        return folder / BASE_CONFIG
    base = str(_read_json(folder / CONFIG_FILE).get('modelBase') or '')
    if not base:
        raise WeightsUnavailableError(f'{str(folder / CONFIG_FILE)!r} names no modelBase')
    if (Path(base).expanduser() / CONFIG_FILE).is_file():
        return Path(base).expanduser() / CONFIG_FILE
    try:
        return hub_file(base, (CONFIG_FILE,))
    except HubFileUnavailable as e:
        raise _unavailable(resolved, f"its modelBase {base!r}'s {CONFIG_FILE}: {e}") from e


def _weights(folder: Path) -> dict:
    for name in WEIGHTS_FILES:
        path = folder / name
        if path.is_file():
            if name.endswith('.safetensors'):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(str(path), map_location='cpu', weights_only=True)  # no pickled code
    raise WeightsUnavailableError(f'{str(folder)!r} has no weights file ({" or ".join(WEIGHTS_FILES)})')


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise BackendUnavailableError(
            "M-CLIP's text tower is a transformers model: pip install 'clipserve[multilingual]' (or export it "
            'once and serve the ONNX files, which need neither torch nor transformers)'
        ) from e
    return transformers


def build_text_tower(resolved, folder: Path):
    """The multilingual-clip text tower with the folder's weights (fp32, CPU, eval mode)."""
    transformers = _transformers()
    config = _read_json(folder / CONFIG_FILE)
    base = _base_config(transformers, base_config_file(resolved, folder))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tower = MultilingualTextTower(
            transformers.AutoModel.from_config(base, add_pooling_layer=False),
            int(config['transformerDimensions']),
            int(config['numDims']),
        )
    state = {k: v for k, v in _weights(folder).items() if not k.startswith('transformer.pooler.')}
    missing, unexpected = tower.load_state_dict(state, strict=False)
    unexpected = [k for k in unexpected if not k.endswith('position_ids')]  # a buffer older transformers saved
    if missing or unexpected:
        raise WeightsUnavailableError(
            f'the weights in {str(folder)!r} do not fit its {CONFIG_FILE}: missing {missing[:5]}, unexpected {unexpected[:5]}'
        )
    return tower.eval()


def _base_config(transformers, path: Path):
    data = _read_json(path)
    kind = data.get('model_type')
    if not kind:
        raise WeightsUnavailableError(f'{str(path)!r} names no model_type')
    return transformers.AutoConfig.for_model(**data)


class MultilingualTextTower(torch.nn.Module):
    """input_ids, attention_mask -> mean of the transformer's last hidden states over the mask -> linear."""

    def __init__(self, transformer, transformer_dim: int, embed_dim: int):
        super().__init__()
        self.transformer = transformer
        # the package's attribute name, so that its weights load as they are
        self.LinearTransformation = torch.nn.Linear(transformer_dim, embed_dim)

    def forward(self, input_ids, attention_mask):
        embs = self.transformer(input_ids=input_ids, attention_mask=attention_mask)[0]
        embs = (embs * attention_mask.unsqueeze(2)).sum(dim=1) / attention_mask.sum(dim=1)[:, None]
        return self.LinearTransformation(embs)


class MultilingualCLIP(torch.nn.Module):
    """The pair clipserve serves: the image tower of an open_clip model and M-CLIP's text tower."""

    def __init__(self, visual, text: MultilingualTextTower):
        super().__init__()
        self.visual = visual
        self.text = text

    def encode_image(self, pixel_values):
        return self.visual(pixel_values)

    def encode_text_with_mask(self, input_ids, attention_mask):
        return self.text(input_ids, attention_mask)


def build(resolved, device: str, precision: str):
    """The pair in eval mode on `device` in `precision`."""
    text = build_text_tower(resolved, text_folder(resolved))
    image = open_clip_family.build(resolved.image_model, device=device, precision=precision)
    if text.LinearTransformation.out_features != resolved.embed_dim:
        raise WeightsUnavailableError(
            f'{resolved.name}: the text tower projects to {text.LinearTransformation.out_features} dimensions, '
            f'the image tower {resolved.image_model.name} to {resolved.embed_dim}'
        )
    dtype = TORCH_DTYPES[precision]
    model = MultilingualCLIP(image.visual, text.to(device=device, dtype=dtype)).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model
