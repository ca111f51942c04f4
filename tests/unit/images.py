"""Generated test images: seeded noise on smooth gradients, so every resampling tap matters."""

import io

import numpy as np
from PIL import Image


def noise_pixels(width, height, channels=3, seed=0):
    """Gradient plus noise, uint8 HxWxC."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    ramps = [
        xs * 255 / max(width - 1, 1),
        ys * 255 / max(height - 1, 1),
        (xs + ys) * 127 / max(width + height - 2, 1),
    ]
    base = np.stack([ramps[c % 3] for c in range(channels)], axis=-1)
    return np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)


def encode_image(image, fmt, **kwargs):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def noise_rgb(width, height, seed=0):
    return Image.fromarray(noise_pixels(width, height, 3, seed))


def noise_rgba(width, height):
    array = noise_pixels(width, height, 4, seed=1)
    array[:, : width // 4, 3] = 0  # fully transparent stripe: colour under alpha 0 must still match
    return Image.fromarray(array)


def palette_png(width, height):
    return encode_image(noise_rgb(width, height, 2).quantize(64), 'PNG', transparency=0)


def i16_png(width, height):
    ramp = noise_pixels(width, height, 1, seed=3)[:, :, 0].astype(np.uint16) * 257
    return encode_image(Image.fromarray(ramp), 'PNG')
