"""Export a model to ONNX in clip-as-service's two-file layout, and check it against PyTorch on the spot.

    python -m clipserve export onnx ViT-B-32::openai ./vit-b-32-onnx

writes `visual.onnx` (input `pixel_values`), `textual.onnx` (inputs `input_ids`, `attention_mask`;
dynamic batch and sequence axes) and `clipserve.json` (what a torch-free server needs to know:
embedding size, preprocessing, tokenizer, opset, versions, a hash of the weights). The weights go
in ONNX external data files next to the graphs (`visual.onnx.data`, `textual.onnx.data`): ONNX
Runtime then reads them straight into its tensors instead of first holding the whole protobuf, which
lowers peak memory at load by about the size of the weights (ViT-B-32: 828 -> 548 MB).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from importlib import metadata as package_metadata
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from clipserve.backends.export_format import (
    DEFAULT_OPSET,
    EXPORT_FORMAT,
    TEXTUAL_FILE,
    VISUAL_FILE,
    ExportMetadata,
    has_metadata,
    write_metadata,
)
from clipserve.models.hf_tokenizer import TOKENIZER_FILES
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import PreprocessConfig, preprocess_image
from clipserve.models.registry import build_model, resolve, tokenizer_folder
from clipserve.models.tokenizer_factory import make_tokenizer
from clipserve.models.towers import ImageTower, TextTower, sigmoid_logits

TOLERANCE = 1e-4
_TWO_GB = 2 * 1024**3

logger = logging.getLogger(__name__)


class ExportError(RuntimeError):
    """The export failed, or its output differs from PyTorch beyond the tolerance."""


def _clipserve_version() -> str:
    """From the installed package's metadata: importing `clipserve` itself would load the executors."""
    try:
        return package_metadata.version('clipserve')
    except package_metadata.PackageNotFoundError:
        return 'unknown'


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over the parameters and buffers, by name: identifies the weights an export came from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def export_graph(
    module, args, path: Path, input_names, output_name, dynamic_axes, opset: int, external_data: bool
) -> None:
    """torch.export-based ONNX export (the TorchScript exporter bakes attention's shapes into constants)."""
    shapes = {
        name: {
            axis: torch.export.Dim(label, min=1, max=4096 if label == 'batch' else args[0].shape[1])
            for axis, label in dynamic_axes[name].items()
        }
        for name in input_names
    }
    # Two inputs with the same named axis must share one Dim object.
    dims = {}
    for name in input_names:
        shapes[name] = {axis: dims.setdefault(dynamic_axes[name][axis], dim) for axis, dim in shapes[name].items()}
    if not external_data and _parameter_bytes(module) > _TWO_GB * 0.9:
        raise ExportError(f"{path.name} would exceed protobuf's 2 GB limit; export with external data")
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        program = torch.onnx.export(
            module,
            args,
            input_names=input_names,
            output_names=[output_name],
            dynamic_shapes=shapes,
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
    program.save(str(path), external_data=external_data)


def export_onnx(
    name: str,
    out_dir: str | os.PathLike,
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    external_data: bool = True,
    trust_remote_code: bool = False,
    truncate_dim: int | None = None,
) -> ExportMetadata:
    """Export `name` to `out_dir`; returns the metadata written to clipserve.json.

    `external_data`: keep weights in `<graph>.onnx.data` files (False: one self-contained file per
    tower, as clip-as-service shipped them; only possible below 2 GB, and costlier to load).
    `trust_remote_code`, `truncate_dim`: the loading opt-ins of transformers checkpoints (the graphs
    then hold the checkpoint's own code, truncation included).
    """
    resolved = resolve(parse_model_name(name), trust_remote_code, truncate_dim)
    if resolved.output.late_interaction:
        raise ExportError(
            f'{name} is a late-interaction model (ColPali, ColQwen2): the torch backend serves it, there is no ONNX '
            'export (its pages run the whole language model, which two graphs would each hold; docs/late-interaction.md)'
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = build_model(resolved, device='cpu', precision='fp32')
    image, text = ImageTower(model).eval(), TextTower(model).eval()
    context = resolved.context_length
    pixels = torch.from_numpy(sample_pixels(resolved.preprocess, 2, seed=0))
    tokenizer_files = tokenizer_folder(resolved)
    tokenizer = make_tokenizer(resolved.text, tokenizer_files)
    tokens = tokenizer(['a photo of a cat', 'two dogs playing in the snow'])
    ids, mask = torch.from_numpy(tokens.input_ids), torch.from_numpy(tokens.attention_mask)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused attention kernel has no ONNX form
    seq = {0: 'batch', 1: 'sequence'} if text.trimmed else {0: 'batch'}
    try:
        with torch.no_grad(), _without_runtime_checks():
            export_graph(
                image,
                (pixels,),
                out / VISUAL_FILE,
                ['pixel_values'],
                'image_embeds',
                {'pixel_values': {0: 'batch'}},
                opset,
                external_data,
            )
            export_graph(
                text,
                (ids, mask),
                out / TEXTUAL_FILE,
                ['input_ids', 'attention_mask'],
                'text_embeds',
                {'input_ids': seq, 'attention_mask': seq},
                opset,
                external_data,
            )
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    cfg = resolved.preprocess
    metadata = ExportMetadata(
        model=str(resolved.name),
        embed_dim=resolved.embed_dim,
        image_size=cfg.image_size,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
        interpolation=cfg.interpolation,
        resize_mode=cfg.resize_mode,
        crop=cfg.crop,
        tokenizer=resolved.text.tokenizer,
        context_length=context,
        pad_id=int(getattr(tokenizer, 'pad_id', 0)),
        dynamic_sequence=text.trimmed,
        clean=resolved.text.clean,
        strip_sep_token=resolved.text.strip_sep_token,
        sigmoid_logits=list(sigmoid_logits(model)) if sigmoid_logits(model) else None,
        opset=opset,
        exporter=f'clipserve {_clipserve_version()} (format {EXPORT_FORMAT}), torch {torch.__version__}',
        weights_sha256=weights_hash(model),
        patch_size=cfg.patch_size,
        max_num_patches=cfg.max_num_patches,
        max_abs_diff=verify_export(out, image, text, tokenizer, cfg) if verify else {},
    )
    _copy_tokenizer_files(tokenizer_files, out)
    write_metadata(out, metadata)
    return metadata


@contextlib.contextmanager
def _without_runtime_checks():
    """transformers' value checks (Siglip2's position resize asserts its shapes) trace to an op with no ONNX form;
    its own switch turns them off while exporting."""
    key = 'TRANSFORMERS_DISABLE_TORCH_CHECK'
    before = os.environ.get(key)
    os.environ[key] = '1'
    try:
        yield
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before


def _copy_tokenizer_files(source: Path | None, out: Path) -> None:
    """The model's Hugging Face tokenizer files beside the graphs, so the ONNX replica tokenizes torch-free."""
    if source is None:
        return
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def sample_pixels(preprocess: PreprocessConfig, count: int, seed: int) -> np.ndarray:
    """`count` images as the visual graph takes them: noise [count, 3, S, S], or for NaFlex, images of other
    sizes and aspect ratios each (the patch grid, and so the position embeddings, change per image)."""
    rng = np.random.default_rng(seed)
    size = preprocess.image_size
    if preprocess.resize_mode != 'naflex':
        return rng.normal(size=(count, 3, size, size)).astype(np.float32)
    shapes = [(size // 2 + 7, 2 * size), (3 * size, size // 3 + 1), (5, 9), (size, size)][seed % 2 :]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in shapes[:count]]
    return np.stack([preprocess_image(image, preprocess) for image in images])


def verify_export(
    out: Path, image: torch.nn.Module, text: torch.nn.Module, tokenizer, preprocess: PreprocessConfig
) -> dict:
    """Run both graphs in ONNX Runtime and PyTorch on fresh inputs; raise above TOLERANCE."""
    import onnxruntime as ort

    pixels = sample_pixels(preprocess, 3, seed=1)  # another batch size (and NaFlex shapes) than exported
    tokens = tokenizer(['a diagram', 'three red apples on a wooden table, seen from above', 'x'])
    ids, mask = tokens.input_ids, tokens.attention_mask
    if text.trimmed:  # another sequence length than exported
        longest = int(mask.sum(axis=1).max())
        ids, mask = ids[:, :longest], mask[:, :longest]
    diffs = {}
    options = ort.SessionOptions()
    for tower, inputs, module in (
        ('visual', {'pixel_values': pixels}, image),
        ('textual', {'input_ids': ids, 'attention_mask': mask}, text),
    ):
        session = ort.InferenceSession(str(out / f'{tower}.onnx'), options, providers=['CPUExecutionProvider'])
        got = session.run(None, inputs)[0]
        with torch.no_grad():
            want = module(*[torch.from_numpy(v) for v in inputs.values()]).numpy()
        diffs[tower] = float(np.abs(got - want).max())
        logger.info('%s.onnx: max |onnxruntime - torch| = %.2e', tower, diffs[tower])
        if not diffs[tower] <= TOLERANCE:
            raise ExportError(
                f'{tower}.onnx differs from PyTorch by {diffs[tower]:.2e} (> {TOLERANCE:g}); export rejected'
            )
    return diffs


def export_to_cache(name: str, target: Path, opset: int = DEFAULT_OPSET, **load) -> Path:
    """Export into `target` atomically (a temporary sibling directory renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix='.export-') as tmp:
        export_onnx(name, tmp, opset=opset, **load)
        try:
            os.rename(tmp, target)
        except OSError:
            if not has_metadata(target):  # another process won the race: fine
                raise
        else:
            os.makedirs(tmp)  # so TemporaryDirectory's cleanup finds something to remove
    return target
