"""CLIP-family checkpoints in transformers' format: `transformers:<hub id>` or `transformers:/path/to/folder`
(ColPali and ColQwen2 checkpoints are handed to late_interaction.py).

A folder as `save_pretrained` writes it (config.json, the weights, the tokenizer files,
preprocessor_config.json) whose `model_type` is one transformers ships a CLIP-family model for. The
embeddings are what the model's own `get_text_features` / `get_image_features` return. Texts are
tokenized by the folder's tokenizer.json (no cleaning), truncated to the tokenizer's model_max_length
(capped by the text tower's positions) and given the inputs the tokenizer names (`model_input_names`);
images are preprocessed as the folder's processor does it with PIL (resize, center crop with
transformers' offsets, rescale, normalise; SigLIP2: NaFlex patches, laid out as naflex.py says). SigLIP
and SigLIP2 pool at the last position, so their texts are padded to exactly their length; the others
attend to unmasked tokens only, so batches are trimmed.

A checkpoint that ships its own model code (config.json's `auto_map`, Jina CLIP v2 for one) is refused
unless the operator opts in (`trust_remote_code`): that code is arbitrary Python from the checkpoint's
authors, run with the server's rights. With the opt-in, the start logs each code file with its sha256,
the model's own `get_text_features` / `get_image_features` give the embeddings, and its texts are never
trimmed (clipserve cannot know how the model pools). `truncate_dim` keeps the first N dimensions of a
model trained for it (config.json's `matryoshka_dimensions`).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models.cache import CACHE_ENV, cache_dir
from clipserve.models.dtypes import TORCH_DTYPES
from clipserve.models.families import late_interaction
from clipserve.models.families.late_interaction_files import LATE_TYPES, PROCESSOR_CONFIG_FILE, is_late_interaction
from clipserve.models.families.transformers_configs import (
    CONFIG_FILE,
    MODEL_TYPES,
    PROCESSOR_FILE,
    SIGMOID_TYPES,
    WEIGHTS_FILES,
    model_type_facts,
    preprocess_config,
    read_json,
    text_facts,
)
from clipserve.models.hf_tokenizer import TOKENIZER_FILE, TOKENIZER_FILES
from clipserve.models.hub import HubFileUnavailable, hub_snapshot
from clipserve.models.naflex import EXTRA_COLUMNS
from clipserve.models.names import TRANSFORMERS_FAMILY, ModelName
from clipserve.models.resolved import ResolvedModel
from clipserve.models.text_spec import HF_TOKENIZER, TextSpec

FAMILY = TRANSFORMERS_FAMILY

logger = logging.getLogger(__name__)


def checkpoint_folder(name: ModelName) -> Path:
    """The checkpoint's folder: the local one the name gives, else the hub repository's files in the cache."""
    source = name.transformers_source
    local = Path(source).expanduser()
    if source.startswith(('/', '.', '~')) or local.is_dir():
        if not (local / CONFIG_FILE).is_file():
            raise WeightsUnavailableError(
                f'{str(local)!r} (from {str(name)!r}) is not a transformers checkpoint folder: it needs '
                f'{CONFIG_FILE}, the weights ({" or ".join(WEIGHTS_FILES[::2])}), {TOKENIZER_FILE} and {PROCESSOR_FILE}'
            )
        return local
    # *.py: a checkpoint's own model code, run only with trust_remote_code (code in another repository:
    # remote_code_files)
    patterns = [CONFIG_FILE, PROCESSOR_FILE, 'model*.safetensors*', 'pytorch_model.bin', '*.py', *TOKENIZER_FILES]
    patterns.append(PROCESSOR_CONFIG_FILE)  # ColPali / ColQwen2: the processor's prompts (late_interaction_files.py)
    try:
        return hub_snapshot(source, patterns, required=CONFIG_FILE)
    except HubFileUnavailable as e:
        raise WeightsUnavailableError(
            f'cannot get the checkpoint {source!r}: {e}. It downloads on first use into the cache '
            f'{str(cache_dir())!r} (set ${CACHE_ENV} to move it), which needs network access. Offline, copy a '
            f'cache that has it, or copy its files into a folder and serve "transformers:/path/to/folder"'
        ) from e


def tokenizer_folder(resolved) -> Path:
    """The checkpoint's own folder, which must hold its tokenizer.json."""
    if not (resolved.local_dir / TOKENIZER_FILE).is_file():
        raise WeightsUnavailableError(
            f'{str(resolved.local_dir)!r} has no {TOKENIZER_FILE}: save the tokenizer beside the model '
            '(tokenizer.save_pretrained(folder)) or copy its tokenizer files there'
        )
    return resolved.local_dir


def code_files(folder: Path) -> dict[str, str]:
    """The Python files a checkpoint ships (its own model code), with their sha256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob('*.py'))}


def code_repositories(config: dict) -> dict[str, str]:
    """Repositories whose code config.json's auto_map names ('org/repo--module.Class', as Jina CLIP v2's
    points into jinaai/jina-clip-implementation), each with the module file it names first."""
    found: dict[str, str] = {}
    for value in (config.get('auto_map') or {}).values():
        for reference in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(reference, str) and '--' in reference:
                repo, _, target = reference.partition('--')
                found.setdefault(repo, target.rsplit('.', 1)[0] + '.py')
    return found


def remote_code_files(folder: Path, config: dict) -> dict[str, str]:
    """Every Python file the model's code comes from, with its sha256: the folder's own, and those of the
    repositories its auto_map names, fetched into clipserve's cache (where transformers then finds them)."""
    files = code_files(folder)
    for repo, module in code_repositories(config).items():
        try:
            code = hub_snapshot(repo, ['*.py'], required=module)
        except HubFileUnavailable as e:
            raise WeightsUnavailableError(
                f"{str(folder)!r}'s auto_map runs code from the repository {repo!r} ({module}), which is not in the "
                f'cache {str(cache_dir())!r} and cannot be downloaded: {e}. Fetch it once with network access, or '
                'copy its .py files into the checkpoint folder and point auto_map at them'
            ) from e
        files.update({f'{repo}/{name}': digest for name, digest in code_files(code).items()})
    return files


def model_type(folder: Path, trust_remote_code: bool = False) -> str:
    """The checkpoint's model_type, if clipserve serves it; a checkpoint with its own code only when allowed."""
    config = read_json(folder / CONFIG_FILE)
    kind = config.get('model_type')
    if config.get('auto_map'):
        if not trust_remote_code:
            elsewhere = [f'{module} from {repo}' for repo, module in code_repositories(config).items()]
            files = ', '.join([*code_files(folder), *elsewhere]) or 'none in the folder'
            raise UnknownModelError(
                f'{str(folder)!r} is a model with its own code (config.json has an auto_map; files: {files}). '
                'clipserve does not run code shipped with a checkpoint unless the operator allows it with '
                'trust_remote_code: true (executor argument; --trust-remote-code for the exporter): that code '
                "runs with the server's rights, so read it first"
            )
        return str(kind or 'remote-code')
    if kind not in MODEL_TYPES:
        raise UnknownModelError(
            f'{str(folder)!r} has model_type {kind!r}; clipserve serves transformers checkpoints of the types '
            f'{", ".join(MODEL_TYPES)} (`python -m clipserve models --family transformers`), the late-interaction '
            f'types {", ".join(LATE_TYPES)} (`--family late-interaction`), and models with their own code when '
            'allowed (trust_remote_code)'
        )
    return kind


def _truncation(folder: Path, config: dict, truncate_dim: int | None, embed_dim: int) -> int:
    if truncate_dim is None:
        return embed_dim
    trained = config.get('matryoshka_dimensions') or []
    if int(truncate_dim) not in [int(d) for d in trained]:
        raise UnknownModelError(
            f'truncate_dim {truncate_dim}: {str(folder)!r} is trained for truncation to '
            f'{", ".join(map(str, trained)) if trained else "no size (config.json has no matryoshka_dimensions)"}'
        )
    return int(truncate_dim)


def resolve(name: ModelName, trust_remote_code: bool = False, truncate_dim: int | None = None) -> ResolvedModel:
    """The checkpoint's facts from its files (a hub checkpoint downloads here, once, into the cache)."""
    folder = checkpoint_folder(name)
    late = read_json(folder / CONFIG_FILE)
    if is_late_interaction(late.get('model_type')) and not late.get('auto_map'):
        return late_interaction.resolve(name, folder, late['model_type'], truncate_dim)
    kind = model_type(folder, trust_remote_code)
    config = read_json(folder / CONFIG_FILE)
    if kind in SIGMOID_TYPES:
        embed_dim = (config.get('text_config') or {}).get('hidden_size', 768)
    else:
        embed_dim = config.get('projection_dim', 512)
    embed_dim = _truncation(folder, config, truncate_dim, int(embed_dim))
    context, inputs = text_facts(folder, kind)
    return ResolvedModel(
        name=name,
        arch=str(name),
        model_cfg={
            'embed_dim': int(embed_dim),
            'model_type': kind,
            'text_inputs': inputs,
            'remote_code': remote_code_files(folder, config) if config.get('auto_map') else None,
            'truncate_dim': truncate_dim,
        },
        pretrained_cfg={},
        quick_gelu=False,
        preprocess=preprocess_config(folder, kind),
        text=TextSpec(
            tokenizer=HF_TOKENIZER,
            context_length=context,
            clean=model_type_facts(kind).clean,
            causal=not model_type_facts(kind).fixed_length,
            hf_tokenizer_name=name.transformers_source,
        ),
        local_dir=folder,
        family=TRANSFORMERS_FAMILY,
    )


def _features(output) -> torch.Tensor:
    """transformers 5 returns an output whose pooler_output holds the features; 4.x the tensor itself."""
    return output.pooler_output if hasattr(output, 'pooler_output') else output


def split_naflex(batch: torch.Tensor) -> dict:
    """naflex.py's layout [B, N, p*p*3 + 3] as Siglip2's three image inputs (exportable: no data-dependent shapes)."""
    pixels = batch[..., :-EXTRA_COLUMNS]
    rows = (batch[..., -2] > 0.5).sum(-1)
    columns = (batch[..., -1] > 0.5).sum(-1)
    return {
        'pixel_values': pixels,
        'pixel_attention_mask': (batch[..., -3] > 0.5).to(torch.int32),
        'spatial_shapes': torch.stack([rows, columns], -1).to(torch.int64),
    }


class TransformersCLIP(torch.nn.Module):
    """A transformers CLIP-family model behind the towers' interface."""

    def __init__(
        self, model: torch.nn.Module, pass_mask: bool, trims_text: bool, keep: int | None = None, naflex=False
    ):
        super().__init__()
        self.model = model
        self.pass_mask = pass_mask
        self.trims_text = trims_text
        self.keep = keep  # Matryoshka truncation: the first `keep` dimensions
        self.naflex = naflex  # images arrive in naflex.py's layout (SigLIP2)

    @property
    def logit_scale(self):
        """SigLIP's learned scale and bias (towers.sigmoid_logits): /rank's siglip_score."""
        return getattr(self.model, 'logit_scale', None)

    @property
    def logit_bias(self):
        return getattr(self.model, 'logit_bias', None)

    def encode_image(self, pixel_values):
        inputs = split_naflex(pixel_values) if self.naflex else {'pixel_values': pixel_values}
        return _features(self.model.get_image_features(**inputs))[..., : self.keep]

    def encode_text_with_mask(self, input_ids, attention_mask):
        if self.pass_mask:
            out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        else:
            out = self.model.get_text_features(input_ids=input_ids)
        return _features(out)[..., : self.keep]


def build(resolved, device: str, precision: str) -> torch.nn.Module:
    """The checkpoint's model, in eval mode on `device` in `precision`; never with remote code."""
    try:
        import transformers
    except ImportError as e:
        raise BackendUnavailableError(
            "transformers checkpoints run on transformers: pip install 'clipserve[transformers]' (or export the "
            'model once and serve the ONNX files, which need neither torch nor transformers)'
        ) from e
    folder = resolved.local_dir
    remote = resolved.model_cfg['remote_code']
    if remote is not None:
        logger.warning(
            'running model code shipped with %s (trust_remote_code is on): %s',
            folder,
            ', '.join(f'{name} sha256={digest}' for name, digest in remote.items()) or 'no .py file in the folder',
        )
    try:
        model = transformers.AutoModel.from_pretrained(
            str(folder),
            local_files_only=True,
            trust_remote_code=remote is not None,
            dtype=torch.float32,
            cache_dir=str(cache_dir()),  # where remote_code_files put code from other repositories
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise WeightsUnavailableError(f'cannot load the checkpoint in {str(folder)!r}: {type(e).__name__}: {e}') from e
    dtype = TORCH_DTYPES[precision]
    kind = resolved.model_cfg['model_type']
    if not (hasattr(model, 'get_text_features') and hasattr(model, 'get_image_features')):
        raise UnknownModelError(
            f'{type(model).__name__} from {str(folder)!r} has no get_text_features / get_image_features'
        )
    wrapped = TransformersCLIP(
        model,
        'attention_mask' in resolved.model_cfg['text_inputs'],
        not model_type_facts(kind).fixed_length,
        resolved.model_cfg['truncate_dim'],
        naflex=resolved.preprocess.resize_mode == 'naflex',
    )
    wrapped = wrapped.to(device=device, dtype=dtype).eval()
    for parameter in wrapped.parameters():
        parameter.requires_grad_(False)
    return wrapped
