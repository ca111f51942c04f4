"""The one door from bulk jobs to the rest of clipserve: the backends, the image preprocessing, the URI
policy and the text path of the request pipeline, imported here and nowhere else in `clipserve.jobs`.

Bulk embedding must give the vectors the server gives, so it reuses the server's engine instead of a copy
of it: a model is loaded by `create_backend` exactly as a replica loads it, an image is decoded and
preprocessed by the same functions (the same limits and errors), a URL is read under the same
`UriPolicy`, and captions go through the pipeline's text path (tokenized and truncated as served, sorted
by length, padding trimmed). The package around us is being split into subpackages; keeping every such
import in this module makes that a change of a few lines. Nothing here imports Jina or DocArray.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from clipserve.inputs.uris import UriError, UriPolicy
from clipserve.models.preprocess import ImageError, PreprocessConfig, open_image, preprocess_image
from clipserve.models.runtimes import BACKENDS

__all__ = [
    'ImageError',
    'PreprocessConfig',
    'UriError',
    'UriPolicy',
    'LoadedModel',
    'load_model',
    'decode_image',
    'validate_image',
    'pixel_shape',
    'BACKENDS',
]


def decode_image(data: bytes, config: PreprocessConfig) -> tuple[np.ndarray, int, int]:
    """(pixels as the model takes them, width, height) of encoded image bytes; ImageError when they are bad.

    `open_image` then `preprocess_image` is what `preprocess_bytes` does; it is called in two steps here
    only to keep the picture's size (after its EXIF orientation) for the metadata.
    """
    image = open_image(data, config)
    try:
        width, height = image.size
        return preprocess_image(image, config), width, height
    finally:
        image.close()


def pixel_shape(config: PreprocessConfig) -> tuple[int, ...]:
    """The shape one image takes after preprocessing (NaFlex models included): what a Ray batch's rows hold."""
    from PIL import Image

    return tuple(preprocess_image(Image.new('RGB', (config.image_size, config.image_size)), config).shape)


def validate_image(data: bytes, config: PreprocessConfig) -> tuple[int, int]:
    """(width, height) of encoded image bytes that decode in full within the limits; ImageError otherwise.

    Used where a server preprocesses (`--server`): a bad image is found here, as a row error, not by the
    server in the middle of a request.
    """
    image = open_image(data, config)
    try:
        return image.size
    finally:
        image.close()


@dataclasses.dataclass
class LoadedModel:
    """A backend loaded as a replica loads it, with what a bulk job needs from it."""

    backend: object  # clipserve.backends.Backend
    pipeline: object  # clipserve.engine.pipeline.EncodePipeline: its text path
    preprocess: PreprocessConfig
    embed_dim: int
    description: str

    def encode_images(self, pixels: np.ndarray) -> np.ndarray:
        """float32 [B, D], unnormalised, for preprocessed pixels [B, ...] (the backend chunks them as it runs best)."""
        return self.backend.encode_images(pixels)

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """float32 [B, D], unnormalised: tokenized and truncated as served, run sorted by length."""
        return self.pipeline.encode_texts(texts)

    def close(self) -> None:
        self.pipeline.close()
        self.backend.close()


def load_model(
    backend: str,
    model: str,
    device: str | None,
    dtype: str | None,
    model_path: str | None,
    batch_size: int,
    max_pixels: int | None = None,
    threads: int | None = None,
) -> LoadedModel:
    """Load `model` on `backend` once (a Ray worker calls this once per actor)."""
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.engine.pipeline import EncodePipeline

    options = BackendOptions(device=device, dtype=None if dtype in (None, '', 'auto') else dtype, num_threads=threads)
    loaded = create_backend(backend, model, options, model_path=model_path or None, max_batch=batch_size)
    if loaded.output.late_interaction:
        from clipserve.errors import UnknownModelError

        loaded.close()
        raise UnknownModelError(
            f'{loaded.model_name} is a late-interaction model ([tokens, dim] per image): bulk embedding writes one '
            "vector per row (clip-retrieval's layout); serve it and store its vectors yourself (docs/late-interaction.md)"
        )
    preprocess = loaded.preprocess
    if max_pixels is not None:
        preprocess = dataclasses.replace(preprocess, max_pixels=max_pixels)
    pipeline = EncodePipeline(loaded, minibatch_size=batch_size, num_workers=1)
    return LoadedModel(loaded, pipeline, preprocess, int(loaded.embed_dim), loaded.describe())
