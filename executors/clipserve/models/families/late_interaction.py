"""Late-interaction models (ColPali, ColQwen2) on transformers' own ColPaliForRetrieval / ColQwen2ForRetrieval.

`transformers:<hub id or folder>` of model_type colpali or colqwen2 resolves here (families/transformers.py
hands them over; late_interaction_files.py reads the processor's settings). The model takes the token ids
and pixels the processor would give it, and its `embeddings` (one unit vector per token, zero on masked
positions) are the output, [batch, tokens, dim]:

- an image's ids are built here from its prompt (ImagePrompt) and, for ColQwen2, its patch grid, which
  qwen2_patches.py's layout carries; each image's row is right padded to `image_tokens`;
- ColPali runs PaliGemma with `token_type_ids` all zero, as its processor gives them (the whole prompt is
  a prefix: bidirectional attention; without them transformers' PaliGemma attends causally);
- batches are right padded and the padded rows set to exact zeros, so each document's vectors are what it
  gives alone (both models use rotary positions: transformers' left-padded batches agree to rounding).

The weights load directly in the precision asked for (a 3 B ColPali in bf16 never holds an fp32 copy).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from clipserve.errors import BackendUnavailableError, UnknownModelError, WeightsUnavailableError
from clipserve.models import outputs
from clipserve.models.dtypes import TORCH_DTYPES
from clipserve.models.families import late_interaction_files as files
from clipserve.models.families.transformers_configs import CONFIG_FILE, read_json
from clipserve.models.hf_tokenizer import TOKENIZER_FILE
from clipserve.models.names import ModelName
from clipserve.models.qwen2_patches import EXTRA_COLUMNS
from clipserve.models.resolved import ResolvedModel
from clipserve.models.text_spec import HF_TOKENIZER, TextSpec

FAMILY = files.LATE_INTERACTION_FAMILY

logger = logging.getLogger(__name__)


def resolve(name: ModelName, folder: Path, kind: str, truncate_dim: int | None = None) -> ResolvedModel:
    """A ColPali / ColQwen2 checkpoint's facts from its files (no weights loaded)."""
    if truncate_dim is not None:
        raise UnknownModelError(f'truncate_dim: {str(name)!r} is a late-interaction model, not trained for truncation')
    config = read_json(folder / CONFIG_FILE)
    preprocess = files.preprocess(folder, kind)
    prompt, image_seq_length = files.image_prompt(folder, kind, config)
    prefix, suffix = files.query_prompt(folder, kind)
    _, image_cfg = files.processor_settings(folder, kind)
    return ResolvedModel(
        name=name,
        arch=str(name),
        model_cfg={
            'embed_dim': files.embedding_dim(folder),
            'model_type': kind,
            outputs.CONFIG_KEY: True,
            'image_tokens': files.image_tokens(prompt, preprocess, image_seq_length),
            'image_prompt': prompt.as_dict(),
            'temporal_patch_size': int(image_cfg.get('temporal_patch_size') or 1),
            'truncate_dim': None,
        },
        pretrained_cfg={},
        quick_gelu=False,
        preprocess=preprocess,
        text=TextSpec(
            tokenizer=HF_TOKENIZER,
            context_length=files.query_context(folder, config),
            clean='none',
            causal=True,  # attends to unmasked tokens only, one output per token: padding trimmed
            hf_tokenizer_name=name.transformers_source,
            prompt_prefix=prefix,
            prompt_suffix=suffix,
        ),
        local_dir=folder,
        family=FAMILY,
    )


def tokenizer_folder(resolved: ResolvedModel) -> Path:
    if not (resolved.local_dir / TOKENIZER_FILE).is_file():
        raise WeightsUnavailableError(f'{str(resolved.local_dir)!r} has no {TOKENIZER_FILE}')
    return resolved.local_dir


class LateInteractionModel(torch.nn.Module):
    """ColPali / ColQwen2 behind the towers' interface: [B, tokens, dim] per batch of images or texts."""

    trims_text = True  # padding is masked out and each token has its own output

    def __init__(
        self, model: torch.nn.Module, kind: str, prompt: files.ImagePrompt, image_tokens: int, temporal=1, merge=1
    ):
        super().__init__()
        self.model = model
        self.kind = kind
        self.prompt = prompt
        self.image_tokens = image_tokens
        self.temporal = temporal  # ColQwen2: each patch repeated this many times in time
        self.merge_size = merge  # ColQwen2: patches merged merge x merge into one image token
        self.image_seq_length = image_tokens - len(prompt.prefix_ids) - len(prompt.suffix_ids)

    def _prompt_ids(self, counts: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each image's ids (prefix, `count` image tokens, suffix), right padded; and the attention mask."""
        p = self.prompt
        rows = [[*p.prefix_ids, *([p.image_token_id] * n), *p.suffix_ids] for n in counts]
        ids = torch.full((len(rows), max(map(len, rows))), p.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return ids.to(device), mask.to(device)

    def _run(self, attention_mask: torch.Tensor, **inputs) -> torch.Tensor:
        if self.kind == 'colpali':  # the whole sequence is PaliGemma's prefix, as the processor marks it
            inputs['token_type_ids'] = torch.zeros_like(inputs['input_ids'])
        out = self.model(attention_mask=attention_mask, **inputs).embeddings
        return torch.where(attention_mask[..., None].bool(), out, torch.zeros((), dtype=out.dtype, device=out.device))

    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.kind == 'colqwen2':
            inputs = self._qwen2_images(pixel_values)
        else:
            counts = [self.image_seq_length] * len(pixel_values)
            inputs = {'pixel_values': pixel_values}
            inputs['input_ids'], inputs['attention_mask'] = self._prompt_ids(counts, pixel_values.device)
        out = self._run(**inputs)
        return torch.nn.functional.pad(out, (0, 0, 0, self.image_tokens - out.shape[1]))

    def _qwen2_images(self, batch: torch.Tensor) -> dict:
        """qwen2_patches.py's layout as ColQwen2's inputs: patches repeated in time, grids, and the ids."""
        rows = (batch[..., -2] > 0.5).sum(-1)
        columns = (batch[..., -1] > 0.5).sum(-1)
        pixels = batch[..., :-EXTRA_COLUMNS]
        size, count = pixels.shape[-1] // 3, pixels.shape[1]
        patch = int(round(size**0.5))
        pixels = pixels.reshape(len(batch), count, 3, 1, patch, patch).expand(-1, -1, -1, self.temporal, -1, -1)
        grid = torch.stack([torch.ones_like(rows), rows, columns], -1).to(torch.long)
        ids, mask = self._prompt_ids(self._tokens(rows, columns), batch.device)
        return {
            'pixel_values': pixels.reshape(len(batch), count, -1),
            'image_grid_thw': grid,
            'input_ids': ids,
            'attention_mask': mask,
        }

    def _tokens(self, rows: torch.Tensor, columns: torch.Tensor) -> list[int]:
        """Image tokens per image: its patches, merged merge_size x merge_size."""
        merge = self.merge_size
        return [int(r) * int(c) // (merge * merge) for r, c in zip(rows.tolist(), columns.tolist())]

    def encode_text_with_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._run(input_ids=input_ids, attention_mask=attention_mask)


def build(resolved: ResolvedModel, device: str, precision: str) -> torch.nn.Module:
    """The checkpoint's model in eval mode on `device`, loaded in `precision`."""
    try:
        import transformers
    except ImportError as e:
        raise BackendUnavailableError(
            "ColPali / ColQwen2 checkpoints run on transformers: pip install 'clipserve[transformers]'"
        ) from e
    kind = resolved.model_cfg['model_type']
    model_class = getattr(transformers, files.LATE_TYPES[kind].model_class, None)
    if model_class is None:
        raise BackendUnavailableError(
            f'transformers {transformers.__version__} has no {files.LATE_TYPES[kind].model_class}; '
            'ColPali and ColQwen2 need transformers 4.53 or newer'
        )
    folder = resolved.local_dir
    try:
        model = model_class.from_pretrained(str(folder), local_files_only=True, dtype=TORCH_DTYPES[precision])
    except (OSError, ValueError, RuntimeError) as e:
        raise WeightsUnavailableError(f'cannot load the checkpoint in {str(folder)!r}: {type(e).__name__}: {e}') from e
    saved = resolved.model_cfg['image_prompt']
    prompt = files.ImagePrompt(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})
    temporal, merge = resolved.model_cfg['temporal_patch_size'], resolved.preprocess.merge_size or 1
    wrapped = LateInteractionModel(model, kind, prompt, resolved.output.image_tokens, temporal, merge)
    wrapped = wrapped.to(device=device).eval()
    for parameter in wrapped.parameters():
        parameter.requires_grad_(False)
    return wrapped
