"""PyTorch (open_clip) backend."""

from __future__ import annotations

import numpy as np
import torch

from clipserve.backends.base import Backend, BackendOptions
from clipserve.backends.devices import check_index, parse_device
from clipserve.backends.precision import resolve_dtype
from clipserve.errors import BackendUnavailableError
from clipserve.models.loading import TORCH_DTYPES, build_model, tokenizer_folder
from clipserve.models.names import parse_model_name
from clipserve.models.registry import resolve
from clipserve.models.tokenizer_factory import make_tokenizer
from clipserve.models.towers import TextTower, sigmoid_logits


def pick_device(device: str | None) -> str:
    """`None` means CUDA when present; asking for CUDA without it is an error, never a silent CPU fallback."""
    parsed = parse_device(device, 'torch', kinds=('cpu', 'cuda', 'mps'))
    if parsed.kind is None:
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if parsed.kind == 'cuda':
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                f'device {device!r} was asked for, but torch sees no CUDA device '
                f'(torch {torch.__version__}, built for CUDA {torch.version.cuda}). Use device "cpu", or fix the driver.'
            )
        check_index(parsed, torch.cuda.device_count(), 'torch')
    return str(parsed)


class TorchBackend(Backend):
    name = 'torch'

    def __init__(self, model: str | None, options: BackendOptions = BackendOptions(), trim_padding: bool = True):
        super().__init__()
        self.device = pick_device(options.device)
        self.dtype = resolve_dtype('torch', self.device, options.dtype)
        if options.num_threads and self.device == 'cpu':
            torch.set_num_threads(options.num_threads)
        resolved = resolve(parse_model_name(model), options.trust_remote_code, options.truncate_dim)
        self.model_name = str(resolved.name)
        self.embed_dim = resolved.embed_dim
        self.context_length = resolved.context_length
        self.preprocess = resolved.preprocess
        # before the weights: missing tokenizer files fail fast
        self.tokenizer = make_tokenizer(resolved.text, tokenizer_folder(resolved))
        self.pad_id = int(getattr(self.tokenizer, 'pad_id', 0))
        self.model = build_model(resolved, device=self.device, precision=self.dtype)
        self._torch_dtype = TORCH_DTYPES[self.dtype]
        self.text_tower = TextTower(self.model)
        self.sigmoid_logits = sigmoid_logits(self.model)
        self.trims_padding = self.text_tower.trimmed and trim_padding

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            batch = torch.from_numpy(np.ascontiguousarray(pixels)).to(self.device, self._torch_dtype)
            return self.model.encode_image(batch).float().cpu().numpy()

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            ids = torch.from_numpy(input_ids).to(self.device)
            mask = torch.from_numpy(attention_mask).to(self.device)
            return self.text_tower(ids, mask).float().cpu().numpy()
