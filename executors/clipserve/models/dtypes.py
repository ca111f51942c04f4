"""torch's dtypes by clipserve's precision names, shared by the families and the torch backend."""

from __future__ import annotations

import torch

TORCH_DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
