"""PyTorch (open_clip) backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from PIL import Image

from clipserve.backends.base import Backend, BackendOptions
from clipserve.backends.devices import check_index, parse_device
from clipserve.backends.precision import resolve_precision
from clipserve.backends.torch.packed_weights import pack_blocks
from clipserve.errors import BackendUnavailableError
from clipserve.models.dtypes import TORCH_DTYPES
from clipserve.models.names import parse_model_name
from clipserve.models.preprocess import preprocess_image
from clipserve.models.registry import build_model, resolve, tokenizer_folder
from clipserve.models.tokenizer_factory import make_tokenizer
from clipserve.models.towers import TextTower, image_only_modules, sigmoid_logits


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


#: pages per forward pass on a CPU for late-interaction models: a page is ~1,000 tokens through a 2-3 B model,
#: so one page already fills the cores; small passes keep requests interleaved (benchmarks/late_interaction.py)
LATE_INTERACTION_CPU_CHUNK = 2


class TorchBackend(Backend):
    name = 'torch'
    cpu_text_batch = 256  # in process: larger text batches run faster in PyTorch on a CPU (benchmarks/in_process.py)

    def __init__(self, model: str | None, options: BackendOptions = BackendOptions(), trim_padding: bool = True):
        super().__init__()
        self.device = pick_device(options.device)
        self.precision = resolve_precision('torch', self.device, options.dtype)
        self.dtype = self.precision.name
        if options.num_threads and self.device == 'cpu':
            torch.set_num_threads(options.num_threads)
        resolved = resolve(parse_model_name(model), options.trust_remote_code, options.truncate_dim)
        if resolved.output.late_interaction and self.precision.images != self.precision.texts:
            # a page runs the whole language model, which the queries share: one precision for both
            self.precision = dataclasses.replace(
                self.precision,
                texts=self.precision.images,
                reason=f'{self.precision.reason}; late interaction: {self.precision.images} texts too (pages '
                'and queries run the same language model)',
            )
            self.dtype = self.precision.name
        self.model_name = str(resolved.name)
        self.embed_dim = resolved.embed_dim
        self.context_length = resolved.context_length
        self.preprocess = resolved.preprocess
        # before the weights: missing tokenizer files fail fast
        self.tokenizer = make_tokenizer(resolved.text, tokenizer_folder(resolved))
        self.pad_id = int(getattr(self.tokenizer, 'pad_id', 0))
        self.model = build_model(resolved, device=self.device, precision=self.precision.texts)
        self._image_dtype = TORCH_DTYPES[self.precision.texts]
        if self.precision.images != self.precision.texts:
            self._cast_image_tower(TORCH_DTYPES[self.precision.images])
        # after every cast: bf16 blocks on a CPU get their weights laid out for oneDNN once (packed_weights.py)
        self.packed_blocks = pack_blocks(self.model) if self.device == 'cpu' else 0
        self.text_tower = TextTower(self.model, packed_attention=True)
        self.sigmoid_logits = sigmoid_logits(self.model)
        self.trims_padding = self.text_tower.trimmed and trim_padding
        self.output = resolved.output
        if self.output.late_interaction and self.device == 'cpu':
            self.cpu_image_chunk = LATE_INTERACTION_CPU_CHUNK

    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            batch = torch.from_numpy(np.ascontiguousarray(pixels)).to(self.device, self._image_dtype)
            return self.model.encode_image(batch).float().cpu().numpy()

    def _cast_image_tower(self, dtype: torch.dtype) -> None:
        """Run the image tower in `dtype` while the text tower keeps the model's precision (in place: no copy).

        bf16 autocast was measured slower than fp32 on CPUs (it casts every weight on every call), so
        the image tower's modules themselves are cast. A model whose image path does not survive the
        cast keeps fp32 images, and the reason says so.
        """
        size = self.preprocess.image_size
        sample = preprocess_image(Image.new('RGB', (size, size), (127, 127, 127)), self.preprocess)
        pixels = torch.from_numpy(sample[None]).to(self.device)  # the model's own input layout (NaFlex too)
        tokens = self.tokenizer(['a photo'])
        text = tuple(
            torch.from_numpy(np.asarray(a, dtype=np.int64)).to(self.device)
            for a in (tokens.input_ids, tokens.attention_mask)
        )
        modules = []
        try:
            modules = image_only_modules(self.model, pixels, text)
            if not modules:
                raise ValueError('its image and text towers share every module')
            for module in modules:
                module.to(dtype)
            with torch.inference_mode():
                self.model.encode_image(pixels.to(dtype))
        except Exception as e:  # noqa: BLE001 - any failure means: this model keeps fp32 images
            for module in modules:
                module.to(self._image_dtype)
            self.precision = dataclasses.replace(
                self.precision,
                images=self.precision.texts,
                reason=f'{self.precision.reason}; images stay {self.precision.texts}: a {dtype} image tower failed ({e})',
            )
            self.dtype = self.precision.name
            return
        self._image_dtype = dtype

    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            ids = torch.from_numpy(input_ids).to(self.device)
            mask = torch.from_numpy(attention_mask).to(self.device)
            return self.text_tower(ids, mask).float().cpu().numpy()
