"""int8 copies of ONNX graphs for CPUs (`dtype: int8` on the onnx backend), quantized once and cached
(backends/onnx_copies.py).

Dynamic quantization of the MatMul weights (onnxruntime's `quantize_dynamic`): the weights are stored
as int8, the activations quantized per batch at run time, so no calibration data is needed. Which
towers and which granularity pay is measured by benchmarks/precision.py; the choice is `TOWERS` and
`PER_CHANNEL` below.
"""

from __future__ import annotations

import logging
from pathlib import Path

from clipserve.backends.onnx_copies import converted_copy

FORMAT = 1  # bump when the quantization changes, so cached copies are redone
# per-channel weight scales: closer to fp32 than per-tensor (ViT-B-32 texts: min cosine 0.99917 vs
# 0.99888) at the same speed, within this machine's noise
PER_CHANNEL = True
# both towers pay in speed (README, "Precision on the CPU", measures it)
TOWERS = ('visual.onnx', 'textual.onnx')

logger = logging.getLogger(__name__)


def int8_copy(source: Path) -> Path:
    """The int8 copy of the ONNX graph `source` (inputs and outputs stay float32), quantizing it if needed;
    a graph `TOWERS` leaves out is returned as it is."""
    if Path(source).name not in TOWERS:
        return Path(source)
    return converted_copy(source, 'int8', quantize_int8, FORMAT)


def quantize_int8(source: Path, destination: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.getLogger()  # quantize_dynamic warns about pre-processing on the root logger
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            str(source),
            str(destination),
            op_types_to_quantize=['MatMul'],
            per_channel=PER_CHANNEL,
            weight_type=QuantType.QInt8,
            use_external_data_format=True,
        )
    finally:
        quiet.setLevel(level)
