"""A reranker on PyTorch: transformers' `AutoModelForSequenceClassification`, its first logit per pair."""

from __future__ import annotations

import numpy as np
import torch

from clipserve.backends.cross_encoder import CrossEncoder, RerankOptions, pick_dtype
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

    @torch.inference_mode()
    def _score(self, *arrays: np.ndarray) -> np.ndarray:
        inputs = {name: torch.from_numpy(a).to(self.device) for name, a in zip(self.spec.input_names, arrays)}
        return self.model(**inputs).logits[:, 0].float().cpu().numpy()
