"""The interface every runtime implements: pixels in, float32 embeddings out; token ids in, likewise.

A late-interaction backend gives a [tokens, D] array per row instead of one [D] vector, as its model's
output says (models/outputs.py): a fixed token count per kind, each row's padding tokens as zero rows after
its own (the engine drops them per document: engine/token_vectors.py).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from clipserve.backends.precision import Precision
from clipserve.models.outputs import OneVectorOutput, Output
from clipserve.models.preprocess import PreprocessConfig
from clipserve.models.tokenizer import TokenBatch


@dataclass(frozen=True)
class BackendOptions:
    """Runtime settings shared by all backends. `None` means: let the backend pick."""

    device: str | None = None  # 'cpu', 'cuda', 'cuda:1'; None = cuda when present, else cpu
    dtype: str | None = None  # 'fp32', 'fp16', 'bf16', 'int8'; None = auto (backends/precision.py)
    num_threads: int | None = None  # CPU threads for this replica; None = leave the runtime's default
    # how the model may be loaded (transformers checkpoints only; the operator's opt-ins):
    trust_remote_code: bool = False  # run model code shipped with the checkpoint
    truncate_dim: int | None = None  # Matryoshka-trained models: keep the first N dimensions


class Backend(ABC):
    """One loaded model on one runtime.

    Implementations must be safe to call from one thread at a time; the executor serialises calls.
    `model_calls` counts forward passes (one per minibatch), so callers and tests can see how much
    work a request caused without timing anything.
    """

    name: str
    model_name: str
    embed_dim: int
    context_length: int
    preprocess: PreprocessConfig
    device: str
    #: each tower's precision and why (backends/precision.py); `dtype` is its short name
    precision: Precision
    dtype: str
    #: What the text graph needs, declared by each backend so that padding happens here, once:
    #: True when it takes any length up to `context_length` (a causal tower: a batch runs only up to
    #: its longest text), False when it takes exactly `context_length` tokens (padded with `pad_id`).
    trims_padding: bool = False
    pad_id: int = 0
    #: texts -> TokenBatch, as open_clip tokenizes for this model (models/tokenizer_factory.py)
    tokenizer: Callable[[Sequence[str]], TokenBatch]
    #: (learned logit scale, exponentiated; logit bias) of models trained with a sigmoid loss (SigLIP), else None
    sigmoid_logits: tuple[float, float] | None = None
    #: The most rows one forward pass takes (an engine's profile); None: any. Chunking happens here, once.
    max_batch: int | None = None
    #: On a CPU, image batches of 8 run as many images per second as batches of 32 (benchmarks/
    #: backends.py) with a quarter of the activation memory, so bigger ones run 8 at a time.
    cpu_image_chunk: int = 8
    #: In process (engine/model.py), the rows a text pass takes on a CPU when the caller does not say:
    #: PyTorch runs larger text batches faster there, onnxruntime does not (benchmarks/in_process.py).
    cpu_text_batch: int = 32
    #: What one input's embedding is: one vector, or (late interaction) a [tokens, D] array (models/outputs.py)
    output: Output = OneVectorOutput()

    def __init__(self):
        self._counter_lock = threading.Lock()
        self.model_calls = 0
        self.images_encoded = 0
        self.texts_encoded = 0

    def _count(self, images: int = 0, texts: int = 0) -> None:
        with self._counter_lock:
            self.model_calls += 1
            self.images_encoded += images
            self.texts_encoded += texts

    @property
    def image_size(self) -> int:
        return self.preprocess.image_size

    def output_shape(self, kind: str) -> tuple[int, ...]:
        """One row's output for `kind` ('images' or 'texts'): (D,), or (tokens, D) for late interaction."""
        return self.output.row_shape(kind, self.embed_dim, self.context_length)

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [B, 3, S, S] normalised pixels -> float32 [B, D] unnormalised embeddings."""
        if len(pixels) == 0:
            return np.zeros((0, *self.output_shape('images')), dtype=np.float32)
        step = self.cpu_image_chunk if self.device == 'cpu' else (self.max_batch or len(pixels))
        out = _in_chunks(self._encode_images, step, pixels)
        self._count(images=len(pixels))
        return np.ascontiguousarray(self.output.fit(out, 'images', self.context_length), dtype=np.float32)

    def encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """int64 [B, L] token ids (<sot> ... <eot>, zero padded) -> float32 [B, D] unnormalised embeddings.

        When the backend can (`trims_padding`), the batch runs only up to its longest real text: exact
        for CLIP's causal text tower, and several times faster for short queries.
        """
        if len(input_ids) == 0:
            return np.zeros((0, *self.output_shape('texts')), dtype=np.float32)
        input_ids = np.asarray(input_ids, dtype=np.int64)
        if attention_mask is None:  # callers with a tokenizer's TokenBatch pass its mask
            if getattr(getattr(self, 'tokenizer', None), 'pad_id', None) is None:
                # CLIP's BPE pads with 0, which is also a real token ('!'), but <eot> has the largest
                # id of its vocabulary, so argmax finds each text's end.
                lengths = input_ids.argmax(axis=1) + 1
                attention_mask = (np.arange(input_ids.shape[1]) < lengths[:, None]).astype(np.int64)
            else:  # a Hugging Face tokenizer's pad id is a special token no text produces
                attention_mask = (input_ids != self.pad_id).astype(np.int64)
        if self.trims_padding:
            longest = int(attention_mask.sum(axis=1).max())
            input_ids, attention_mask = input_ids[:, :longest], attention_mask[:, :longest]
        elif input_ids.shape[1] != self.context_length:  # a tower that takes exactly the full context
            width = self.context_length
            pad = ((0, 0), (0, max(0, width - input_ids.shape[1])))
            input_ids = np.pad(input_ids, pad, constant_values=self.pad_id)[:, :width]
            attention_mask = np.pad(attention_mask, pad)[:, :width]
        input_ids = np.ascontiguousarray(input_ids)
        attention_mask = np.ascontiguousarray(attention_mask, dtype=np.int64)
        out = _in_chunks(self._encode_texts, self.max_batch or len(input_ids), input_ids, attention_mask)
        self._count(texts=len(input_ids))
        return np.ascontiguousarray(self.output.fit(out, 'texts', self.context_length), dtype=np.float32)

    @abstractmethod
    def _encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """One forward pass: at most `max_batch` rows (and `cpu_image_chunk` on a CPU)."""

    @abstractmethod
    def _encode_texts(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """One forward pass: at most `max_batch` rows, padded or trimmed as `trims_padding` says."""

    def close(self) -> None:
        """Free what the runtime holds (device buffers, streams) now; the backend is not called after.

        The executor calls it once the pipeline has stopped, so no forward pass is running.
        """

    def describe(self) -> str:
        return f'{self.model_name} on {self.name} ({self.device}, {self.dtype}, dim {self.embed_dim})'


def _in_chunks(forward, step: int, *arrays: np.ndarray) -> np.ndarray:
    """`forward` over row chunks of at most `step` rows, results concatenated in order."""
    n = len(arrays[0])
    if n <= step:
        return forward(*arrays)
    return np.concatenate([forward(*(a[i : i + step] for a in arrays)) for i in range(0, n, step)])
