"""The export format: the folder clipserve's ONNX exporter writes and the ONNX-based backends serve.

A folder holds `visual.onnx`, `textual.onnx` (their weights in `.onnx.data` files, or inline) and
`clipserve.json`: what a torch-free server must know to serve the graphs, read and written here as
one typed record. A clip-as-service folder has no `clipserve.json`; its record is inferred from the
graphs and clip-as-service's conventions. Exports of model names are cached, keyed by the model and the
export settings, and made in a separate interpreter so that a serving process never imports torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from clipserve.errors import BackendUnavailableError, WeightsUnavailableError
from clipserve.models.cache import cache_dir
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import OPENAI_MEAN, OPENAI_STD, PreprocessConfig
from clipserve.models.text_spec import BPE_TOKENIZER, DEFAULT_CONTEXT_LENGTH, TextSpec
from clipserve.models.tokenizer_factory import make_tokenizer

METADATA_FILE = 'clipserve.json'
VISUAL_FILE = 'visual.onnx'
TEXTUAL_FILE = 'textual.onnx'
GRAPH_FILES = (VISUAL_FILE, TEXTUAL_FILE)
EXPORT_FORMAT = 2  # bump when the exporter's output changes, so cached exports are redone (2: external data)
DEFAULT_OPSET = 18  # the torch.export-based exporter needs 18 or newer
# clip-as-service's image sizes for models whose graphs have no static input size
_CAS_IMAGE_SIZES = {'RN50x4': 288, 'RN50x16': 384, 'RN50x64': 448, 'ViT-B-16-plus-240': 240, 'ViT-L-14-336': 336}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportMetadata:
    """What `clipserve.json` says. Unknown keys (from a newer exporter) are ignored when read."""

    model: str
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = 'bicubic'
    resize_mode: str = 'shortest'
    crop: str = 'round'  # PreprocessConfig.crop: 'floor' for transformers checkpoints
    # resize_mode 'naflex' (SigLIP2): the visual graph takes naflex.py's layout [B, max_num_patches, p*p*3 + 3]
    patch_size: int | None = None
    max_num_patches: int | None = None
    embed_dim: int | None = None  # None: the backend probes the graph
    tokenizer: str = BPE_TOKENIZER  # text_spec.TOKENIZER_KINDS; Hugging Face tokenizer files lie beside the graphs
    context_length: int = DEFAULT_CONTEXT_LENGTH
    pad_id: int = 0
    dynamic_sequence: bool = False  # the text graph takes any length up to context_length (padding trimmed)
    clean: str = 'lower'  # open_clip's text cleaning for this model (text_spec.CLEAN_MODES)
    sigmoid_logits: list | None = None  # SigLIP models: [exp(logit_scale), logit_bias], for /rank's siglip_score
    strip_sep_token: bool = False
    opset: int | None = None
    exporter: str | None = None
    weights_sha256: str | None = None
    max_abs_diff: dict = field(default_factory=dict)  # tower -> max |onnxruntime - torch| at export

    @classmethod
    def from_dict(cls, data: dict) -> ExportMetadata:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ('mean', 'std'):
            if key in values:
                values[key] = tuple(float(x) for x in values[key])
        return cls(**values)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data['mean'], data['std'] = list(self.mean), list(self.std)
        return data

    def text_spec(self) -> TextSpec:
        return TextSpec(
            tokenizer=self.tokenizer,
            context_length=int(self.context_length),
            clean=self.clean,
            strip_sep_token=bool(self.strip_sep_token),
            causal=bool(self.dynamic_sequence),
        )

    def preprocess_config(self) -> PreprocessConfig:
        return PreprocessConfig(
            image_size=int(self.image_size),
            mean=tuple(self.mean),
            std=tuple(self.std),
            interpolation=self.interpolation,
            resize_mode=self.resize_mode,
            crop=self.crop,
            patch_size=self.patch_size,
            max_num_patches=self.max_num_patches,
        )


def require_fixed_size(metadata: ExportMetadata, backend: str) -> None:
    """Refuse a NaFlex export (SigLIP2: per-image patch grids) in a backend built around one image shape."""
    if metadata.resize_mode == 'naflex':
        raise BackendUnavailableError(
            f'{metadata.model} is a SigLIP2 NaFlex model (a patch grid per image), which the {backend} backend does '
            'not serve; serve it with the torch or onnx backend'
        )


def export_tokenizer(folder: Path, metadata: ExportMetadata):
    """The tokenizer of an export: open_clip's BPE, or the Hugging Face tokenizer files beside the graphs."""
    try:
        return make_tokenizer(metadata.text_spec(), folder)
    except ValueError as e:
        raise WeightsUnavailableError(f'the export in {str(folder)!r} cannot be tokenized: {e}; re-export it') from e


def has_metadata(folder: Path) -> bool:
    return (Path(folder) / METADATA_FILE).is_file()


def read_metadata(folder: Path) -> ExportMetadata:
    path = Path(folder) / METADATA_FILE
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f'a JSON object was expected, not {type(data).__name__}')
        return ExportMetadata.from_dict(data)
    except (OSError, ValueError, TypeError) as e:
        raise WeightsUnavailableError(f'cannot read {path} ({e}); re-export the model') from e


def write_metadata(folder: Path, metadata: ExportMetadata) -> None:
    (Path(folder) / METADATA_FILE).write_text(json.dumps(metadata.to_dict(), indent=2))


def clip_as_service_metadata(
    model: str | None, folder: Path, graph_image_size: int | None, graph_embed_dim: int | None
) -> ExportMetadata:
    """A clip-as-service folder: OpenAI mean/std for every model, 77 tokens, the size from the graph or its table."""
    parsed = parse_model_name(model) if model else None
    size = graph_image_size or _CAS_IMAGE_SIZES.get(parsed.arch if parsed else '', 224)
    return ExportMetadata(
        model=str(parsed) if parsed else Path(folder).name,
        image_size=size,
        mean=OPENAI_MEAN,
        std=OPENAI_STD,
        embed_dim=graph_embed_dim,
    )


def missing_files(folder: Path, files=GRAPH_FILES) -> list[str]:
    folder = Path(folder)
    return [f for f in files if not (folder / f).is_file()]


def load_flags(trust_remote_code: bool = False, truncate_dim: int | None = None) -> list[str]:
    """The exporter's command-line flags for the model-loading opt-ins (`python -m clipserve export onnx`)."""
    flags = ['--trust-remote-code'] if trust_remote_code else []
    return flags + (['--truncate-dim', str(int(truncate_dim))] if truncate_dim is not None else [])


def export_cache_dir(
    name: str, opset: int = DEFAULT_OPSET, trust_remote_code: bool = False, truncate_dim: int | None = None
) -> Path:
    """Where the export of `name` is cached: keyed by model, export settings, loading opt-ins and, for
    files, their identity."""
    parsed = parse_model_name(name)
    key = f'{parsed}|opset={opset}|format={EXPORT_FORMAT}|{" ".join(load_flags(trust_remote_code, truncate_dim))}'
    files = [parsed.checkpoint_path, parsed.config_path]
    # a local-dir folder, or an M-CLIP name's folder of files: the identity of each file in it
    for folder in (parsed.local_dir, parsed.checkpoint_path):
        if folder and os.path.isdir(os.path.expanduser(folder)):
            folder = os.path.expanduser(folder)
            files += sorted(os.path.join(folder, f) for f in os.listdir(folder))
    for path in files:
        if path and os.path.isfile(path):
            stat = os.stat(path)
            key += f'|{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}'
    readable = re.sub(r'[^A-Za-z0-9._-]+', '-', str(parsed))[-60:].strip('-')
    return cache_dir() / 'onnx' / f'{readable}-{hashlib.sha256(key.encode()).hexdigest()[:12]}'


def export_in_subprocess(name: str, target: Path, flags: list[str] | None = None) -> None:
    """Run the exporter in another interpreter, so that this serving process never imports torch."""
    logger.info('exporting %s to ONNX into %s (first use; later starts load the cached files)', name, target)
    result = subprocess.run(
        [sys.executable, '-m', 'clipserve', 'export', 'onnx', '--cache', *(flags or []), name, str(target)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        if 'No module named' in result.stderr and ('torch' in result.stderr or 'open_clip' in result.stderr):
            raise BackendUnavailableError(
                f'exporting {name} to ONNX needs PyTorch: install the torch extra (pip install "clipserve[torch]"), '
                'or export on another machine with `python -m clipserve export onnx NAME DIR` and pass model_path=DIR'
            )
        raise WeightsUnavailableError(f'exporting {name} to ONNX failed:\n{result.stderr[-4000:]}')


def locate_export(
    model: str | None,
    model_path: str | None,
    trust_remote_code: bool = False,
    truncate_dim: int | None = None,
    required: tuple[str, ...] = GRAPH_FILES,
) -> Path:
    """The export folder a backend serves: `model_path` (holding `required`), else the cached export of `model`
    (made on first use)."""
    if model_path:
        folder = Path(model_path).expanduser()
        missing = missing_files(folder, required)
        if not folder.is_dir() or missing:
            raise WeightsUnavailableError(
                f'model_path {str(folder)!r} must be a directory holding {" and ".join(required)} '
                f'(missing: {", ".join(missing) if folder.is_dir() else "the directory itself"}); '
                'write one with `python -m clipserve export onnx NAME DIR`'
            )
        return folder
    return cached_export(model, trust_remote_code, truncate_dim)


def cached_export(name: str, trust_remote_code: bool = False, truncate_dim: int | None = None) -> Path:
    """The cached export of model `name`, exported on first use."""
    target = export_cache_dir(name, trust_remote_code=trust_remote_code, truncate_dim=truncate_dim)
    if not has_metadata(target):
        export_in_subprocess(str(parse_model_name(name)), target, load_flags(trust_remote_code, truncate_dim))
    return target
