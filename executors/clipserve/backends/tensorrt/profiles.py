"""What TensorRT engines are built for: device, precision and batch options, and the optimisation profiles
(shape ranges) of each tower. Plain Python; unit-tested without TensorRT."""

from __future__ import annotations

from dataclasses import dataclass

from clipserve.backends.devices import parse_device
from clipserve.backends.precision import resolve_dtype
from clipserve.errors import BackendUnavailableError, InvalidParameterError

OPT_TEXT_LENGTH = 16  # TensorRT tunes kernels for the opt shape; real queries are 10-20 tokens


# ---- options ----------------------------------------------------------------------------------


def parse_cuda_device(device: str | None) -> int:
    """The CUDA device index for `device`; `None` means the first GPU. There is no CPU path."""
    parsed = parse_device(device, 'tensorrt')
    if parsed.kind == 'cpu':
        raise BackendUnavailableError(
            'the tensorrt backend runs on NVIDIA GPUs only; for the CPU choose backend "onnx" or "torch"'
        )
    return parsed.index or 0


def pick_precision(dtype: str | None) -> str:
    """fp16 unless asked otherwise: it is why one uses TensorRT. fp32 disables TF32 too, so it means fp32."""
    return resolve_dtype('tensorrt', 'cuda', dtype)


def check_max_batch(max_batch) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise InvalidParameterError(f'max_batch must be a positive integer, got {max_batch!r}')
    return max_batch


# ---- optimisation profiles --------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeProfile:
    """The min/opt/max shapes TensorRT builds one input for; any shape in between runs without a rebuild."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def image_profiles(max_batch: int, image_size: int, name: str = 'pixel_values') -> tuple[ShapeProfile, ...]:
    """Batch 1..max_batch of S x S RGB; tuned for full minibatches, the throughput case."""
    max_batch = check_max_batch(max_batch)
    shape = (3, image_size, image_size)
    return (ShapeProfile(name, (1, *shape), (max_batch, *shape), (max_batch, *shape)),)


def text_profiles(
    max_batch: int,
    context_length: int,
    dynamic_sequence: bool,
    names: tuple[str, ...] = ('input_ids', 'attention_mask'),
) -> tuple[ShapeProfile, ...]:
    """Batch 1..max_batch, and length 1..context when the export lets the base class trim padding.

    Every text input gets the same profile: ids and mask always share their shape.
    """
    max_batch = check_max_batch(max_batch)
    if dynamic_sequence:
        lengths = (1, min(context_length, OPT_TEXT_LENGTH), context_length)
    else:
        lengths = (context_length,) * 3
    return tuple(
        ShapeProfile(name, (1, lengths[0]), (max_batch, lengths[1]), (max_batch, lengths[2])) for name in names
    )


def profile_signature(profiles) -> str:
    """A canonical text form of the profiles, for the cache key: order of inputs does not matter."""

    def dims(shape):
        return 'x'.join(str(d) for d in shape)

    return ';'.join(
        f'{p.name}={dims(p.min)}/{dims(p.opt)}/{dims(p.max)}' for p in sorted(profiles, key=lambda p: p.name)
    )
