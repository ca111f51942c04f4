"""A reranker on PyTorch: transformers' `AutoModelForSequenceClassification`, its first logit per pair."""

from __future__ import annotations

import numpy as np
import torch

from clipserve.backends.cross_encoder import CrossEncoder, RerankOptions, pick_dtype
from clipserve.backends.torch.packed_weights import pack_linears
from clipserve.models.cross_encoder import CrossEncoderSpec
from clipserve.models.dtypes import TORCH_DTYPES


class TorchCrossEncoder(CrossEncoder):
    name = 'torch'

    def __init__(self, spec: CrossEncoderSpec, options: RerankOptions = RerankOptions()):
        super().__init__()
        from transformers import AutoModelForSequenceClassification

        self.spec = spec
        self.device = options.device or 'cpu'
        self.dtype = pick_dtype('torch', self.device, options.dtype)
        if options.num_threads:
            torch.set_num_threads(options.num_threads)
        model = AutoModelForSequenceClassification.from_pretrained(str(spec.folder), dtype=TORCH_DTYPES[self.dtype])
        self.model = model.eval().to(self.device)
        # bf16 on a CPU: the weights laid out for oneDNN once, not on every call (packed_weights.py)
        self.packed_linears = pack_linears(self.model, self._sample) if self.device == 'cpu' else 0

    def _sample(self) -> torch.Tensor:
        """The model's logits for two pairs of eight tokens (id 1; segment ids 0): a check of the packed layers."""
        return self._run(
            {name: np.full((2, 8), 0 if 'type' in name else 1, np.int64) for name in self.spec.input_names}
        )

    @torch.inference_mode()
    def _score(self, *arrays: np.ndarray) -> np.ndarray:
        return self._run(dict(zip(self.spec.input_names, arrays)))[:, 0].float().cpu().numpy()

    def _run(self, arrays: dict) -> torch.Tensor:
        return self.model(**{name: torch.from_numpy(a).to(self.device) for name, a in arrays.items()}).logits
