"""fp16 copies of ONNX graphs for CUDA, converted once and cached (backends/onnx/copies.py)."""

from __future__ import annotations

from pathlib import Path

from clipserve.backends.onnx.copies import DATA_FILE, INTEGRITY_FILE, MODEL_FILE, converted_copy

FORMAT = 1  # bump when the conversion changes, so cached copies are redone

__all__ = ['DATA_FILE', 'INTEGRITY_FILE', 'MODEL_FILE', 'convert_to_fp16', 'fp16_copy']


def fp16_copy(source: Path) -> Path:
    """The fp16 copy of the ONNX graph `source` (inputs and outputs stay float32), converting it if needed."""
    return converted_copy(source, 'fp16', convert_to_fp16, FORMAT)


def convert_to_fp16(source: Path, destination: Path) -> None:
    """Convert from the file path: shape inference runs on files (in memory it stops at 2 GB) and the
    result is always saved with external data."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    inferred = destination.with_name('inferred.onnx')
    onnx.shape_inference.infer_shapes_path(str(source), str(inferred))
    model = onnx.load(str(inferred), load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(source.parent))
    inferred.unlink()
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)
    del model
    onnx.save_model(
        converted, str(destination), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE
    )
