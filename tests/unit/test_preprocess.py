"""clipserve.models.preprocess against open_clip's own eval transform, plus its guards.

Images are generated here (seeded noise on smooth gradients, so every resampling
tap matters).  Parity images carry no EXIF orientation: open_clip ignores it and
we honour it.  Run with ``-s`` to see the max-abs-diff figures.
"""

import io
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from clipserve.models import preprocess as pp
from clipserve.models.preprocess import (
    OPENAI_MEAN,
    OPENAI_STD,
    ImageError,
    PreprocessConfig,
    image_from_array,
    open_image,
    preprocess_bytes,
    preprocess_image,
)

from .images import encode_image, i16_png, noise_pixels, noise_rgb, noise_rgba, palette_png
from .standalone_imports import third_party_imports

TOLERANCE = 1e-5
OTHER_MEAN, OTHER_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


PARITY_CASES = {
    'rgb_jpeg': lambda: encode_image(noise_rgb(640, 480), 'JPEG', quality=90),
    'rgb_png_portrait': lambda: encode_image(noise_rgb(333, 500, 4), 'PNG'),
    'rgba_png': lambda: encode_image(noise_rgba(300, 200), 'PNG'),
    'palette_png_transparency': lambda: palette_png(257, 190),
    'grayscale_png': lambda: encode_image(noise_rgb(301, 451, 5).convert('L'), 'PNG'),
    'la_png': lambda: encode_image(noise_rgba(211, 150).convert('LA'), 'PNG'),
    'cmyk_jpeg': lambda: encode_image(noise_rgb(320, 240, 6).convert('CMYK'), 'JPEG', quality=90),
    '1x1_png': lambda: encode_image(noise_rgb(1, 1, 7), 'PNG'),
    'wide_2000x10_png': lambda: encode_image(noise_rgb(2000, 10, 8), 'PNG'),
    'tall_10x2000_png': lambda: encode_image(noise_rgb(10, 2000, 9), 'PNG'),
    'wide_rgba_1500x9_png': lambda: encode_image(noise_rgba(1500, 9), 'PNG'),
    'i16_png': lambda: i16_png(200, 150),
}


def _open_clip_reference(
    image, size, mean=OPENAI_MEAN, std=OPENAI_STD, resize_mode='shortest', interpolation='bicubic'
):
    import open_clip

    transform = open_clip.image_transform(
        size, is_train=False, mean=mean, std=std, resize_mode=resize_mode, interpolation=interpolation
    )
    return transform(image).numpy()


def _report(name, ours, ref):
    diff = float(np.abs(ours - ref).max())
    print(f'\n[preprocess parity] {name}: max abs diff {diff:.3g}')
    return diff


# ---------------------------------------------------------------------------
# parity with open_clip


@pytest.mark.parametrize('size', [224, 288])
@pytest.mark.parametrize('case', sorted(PARITY_CASES))
def test_parity_with_open_clip(case, size):
    data = PARITY_CASES[case]()
    config = PreprocessConfig(image_size=size)
    try:
        ref = _open_clip_reference(Image.open(io.BytesIO(data)), size)
    except Exception as exc:  # open_clip's own path cannot handle it: ours must be clear about it
        print(f'\n[preprocess parity] {case}@{size}: open_clip raised {exc!r}')
        try:
            out = preprocess_bytes(data, config)
        except ImageError:
            return
        assert out.shape == (3, size, size) and np.isfinite(out).all()
        return
    ours = preprocess_bytes(data, config)
    assert ours.dtype == np.float32 and ours.shape == (3, size, size) and ours.flags.c_contiguous
    assert _report(f'{case}@{size}', ours, ref) <= TOLERANCE


@pytest.mark.parametrize('case', ['rgb_jpeg', 'rgba_png', 'wide_2000x10_png'])
def test_parity_other_mean_std_and_bilinear(case):
    data = PARITY_CASES[case]()
    for interpolation in ('bicubic', 'bilinear'):
        config = PreprocessConfig(image_size=224, mean=OTHER_MEAN, std=OTHER_STD, interpolation=interpolation)
        ref = _open_clip_reference(
            Image.open(io.BytesIO(data)), 224, OTHER_MEAN, OTHER_STD, interpolation=interpolation
        )
        ours = preprocess_bytes(data, config)
        assert _report(f'{case} mean/std 0.5 {interpolation}', ours, ref) <= TOLERANCE


@pytest.mark.parametrize('case', ['rgb_jpeg', 'palette_png_transparency', 'wide_2000x10_png', '1x1_png'])
def test_parity_squash(case):
    data = PARITY_CASES[case]()
    config = PreprocessConfig(image_size=224, resize_mode='squash')
    ref = _open_clip_reference(Image.open(io.BytesIO(data)), 224, resize_mode='squash')
    assert _report(f'{case} squash', preprocess_bytes(data, config), ref) <= TOLERANCE


@pytest.mark.parametrize('width, height', [(20000, 100), (300, 30000), (100, 20000)])
def test_parity_memory_guard_sizes(width, height):
    """Elongated images take the windowed path (both pass orders); still open_clip's numbers."""
    image = noise_rgb(width, height, seed=11)
    new_size = pp._shortest_side_size(width, height, 224)
    assert pp._plain_resize_pixels(width, height, *new_size) > pp._PLAIN_RESIZE_MAX_PIXELS
    ref = _open_clip_reference(image, 224)
    assert _report(f'guard {width}x{height}', preprocess_image(image, PreprocessConfig()), ref) <= TOLERANCE


def test_from_open_clip_config_matches_open_clip():
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = {
        'size': (288, 288),
        'mean': OTHER_MEAN,
        'std': OTHER_STD,
        'interpolation': 'bilinear',
        'resize_mode': 'shortest',
        'fill_color': 0,
        'mode': 'RGB',
    }
    config = PreprocessConfig.from_open_clip(cfg)
    assert (config.image_size, config.mean, config.std, config.interpolation) == (
        288,
        OTHER_MEAN,
        OTHER_STD,
        'bilinear',
    )
    image = noise_rgb(500, 350, 12)
    ref = image_transform_v2(PreprocessCfg(**cfg), is_train=False)(image).numpy()
    assert _report('from_open_clip 288 bilinear', preprocess_image(image, config), ref) <= TOLERANCE


def test_from_open_clip_defaults_and_rejections():
    assert PreprocessConfig.from_open_clip({}) == PreprocessConfig()
    assert PreprocessConfig.from_open_clip({'interpolation': 'random'}).interpolation == 'bicubic'
    assert PreprocessConfig.from_open_clip({'mean': 0.5}).mean == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match='square'):
        PreprocessConfig.from_open_clip({'size': (224, 256)})
    with pytest.raises(ValueError, match='resize_mode'):
        PreprocessConfig.from_open_clip({'resize_mode': 'longest'})
    with pytest.raises(ValueError):
        PreprocessConfig(std=(0.5, 0.0, 0.5))
    with pytest.raises(ValueError):
        PreprocessConfig(interpolation='lanczos')


# ---------------------------------------------------------------------------
# decoding: errors and limits


def _png_with_declared_size(width, height):
    """A tiny valid PNG whose IHDR claims another size (CRC fixed), like a decompression bomb."""
    data = bytearray(encode_image(Image.new('L', (8, 8)), 'PNG'))
    ihdr = 8  # chunk: length(4) type(4) data(13) crc(4)
    struct.pack_into('>II', data, ihdr + 8, width, height)
    struct.pack_into('>I', data, ihdr + 8 + 13, zlib.crc32(bytes(data[ihdr + 4 : ihdr + 8 + 13])) & 0xFFFFFFFF)
    return bytes(data)


@pytest.mark.parametrize(
    'data, reason',
    [
        (b'', 'empty image data'),
        (np.random.default_rng(0).bytes(4096), 'not an image Pillow can decode'),
        (encode_image(noise_rgb(200, 150), 'JPEG')[:1500], 'truncated or corrupt'),
        (encode_image(noise_rgb(200, 150), 'PNG')[:3000], 'truncated or corrupt'),
        (_png_with_declared_size(30000, 30000), 'too large'),
        (_png_with_declared_size(10000, 6000), '10000x6000 = 60000000 pixels, over the limit of 50000000'),
        (encode_image(noise_rgb(2010, 10), 'PNG'), 'aspect ratio 201.0 is over the limit of 200'),
    ],
    ids=['empty', 'random', 'truncated_jpeg', 'truncated_png', 'bomb_30000', 'over_max_pixels', 'over_aspect'],
)
def test_bad_bytes_raise_image_error(data, reason):
    with pytest.raises(ImageError, match=reason):
        preprocess_bytes(data, PreprocessConfig())


def test_limits_follow_the_config():
    data = encode_image(noise_rgb(100, 50), 'PNG')
    assert preprocess_bytes(data, PreprocessConfig()).shape == (3, 224, 224)
    with pytest.raises(ImageError, match='over the limit of 4999'):
        open_image(data, PreprocessConfig(max_pixels=4999))
    with pytest.raises(ImageError, match='aspect ratio 2.0'):
        open_image(data, PreprocessConfig(max_aspect_ratio=1.5))
    with pytest.raises(ImageError, match='over the limit'):
        preprocess_image(noise_rgb(100, 50), PreprocessConfig(max_pixels=4999))
    with pytest.raises(ImageError, match='bytes'):
        open_image('not bytes', PreprocessConfig())


def test_jpeg_draft_decodes_smaller_but_close():
    """Opt-in draft mode: libjpeg decodes at the smallest 1/2^k scale that still covers the resize
    target, so the pixels are close to, not identical with, open_clip's."""
    data = encode_image(noise_rgb(1280, 960), 'JPEG', quality=92)
    exact, draft = PreprocessConfig(), PreprocessConfig(jpeg_draft=True)
    assert open_image(data, exact).size == (1280, 960)
    assert open_image(data, draft).size == (320, 240)  # 1/4 scale: 240 still covers 224
    a, b = preprocess_bytes(data, exact), preprocess_bytes(data, draft)
    assert a.shape == b.shape == (3, 224, 224)
    assert 0 < np.abs(a - b).mean() < 0.1  # normalised pixels span ~4 units
    squash = PreprocessConfig(jpeg_draft=True, resize_mode='squash')
    assert open_image(data, squash).size == (320, 240)  # covers 224x224 too


def test_jpeg_draft_leaves_other_formats_and_small_jpegs_exact():
    png = encode_image(noise_rgb(1280, 960), 'PNG')
    small = encode_image(noise_rgb(300, 240), 'JPEG', quality=92)  # half scale would fall below 224
    cmyk = encode_image(Image.fromarray(noise_pixels(900, 700, 4)).convert('CMYK'), 'JPEG')
    draft = PreprocessConfig(jpeg_draft=True)
    for data in (png, small):
        np.testing.assert_array_equal(preprocess_bytes(data, draft), preprocess_bytes(data, PreprocessConfig()))
    assert preprocess_bytes(cmyk, draft).shape == (3, 224, 224)


def test_exif_orientation_is_applied():
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = (255, 0, 0)  # left half red
    pixels[:, 20:] = (0, 0, 255)  # right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    data = encode_image(Image.fromarray(pixels), 'JPEG', exif=exif, quality=95)
    image = open_image(data, PreprocessConfig())
    assert image.size == (20, 40)
    top, bottom = image.convert('RGB').getpixel((10, 5)), image.convert('RGB').getpixel((10, 34))
    assert top[0] > 200 and top[2] < 60, top  # what was the left edge is now on top
    assert bottom[2] > 200 and bottom[0] < 60, bottom


def test_animated_gif_uses_first_frame():
    frames = [Image.new('RGB', (32, 24), colour) for colour in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    data = encode_image(frames[0], 'GIF', save_all=True, append_images=frames[1:], duration=50, loop=0)
    image = open_image(data, PreprocessConfig())
    assert image.convert('RGB').getpixel((5, 5)) == (255, 0, 0)
    ref = _open_clip_reference(Image.open(io.BytesIO(data)), 224)
    assert _report('animated gif first frame', preprocess_bytes(data, PreprocessConfig()), ref) <= TOLERANCE


# ---------------------------------------------------------------------------
# tensors as docarray v1 documents carry them


@pytest.mark.parametrize('shape', [(37, 53, 3), (37, 53, 4), (37, 53, 1), (37, 53), (300, 20, 3)])
def test_uint8_tensor_matches_docarray_blob(shape):
    from docarray import Document

    rng = np.random.default_rng(sum(shape))
    tensor = rng.integers(0, 256, shape, dtype=np.uint8)
    doc = Document(tensor=tensor)
    doc.convert_image_tensor_to_blob()
    config = PreprocessConfig()
    from_blob = preprocess_bytes(doc.blob, config)
    from_tensor = preprocess_image(image_from_array(tensor, config), config)
    assert np.array_equal(from_blob, from_tensor)


def test_float_and_wide_int_tensors():
    config = PreprocessConfig()
    pixels = noise_pixels(40, 30)
    want = np.asarray(image_from_array(pixels, config))
    assert np.array_equal(np.asarray(image_from_array(pixels / 255.0, config)), want)
    assert np.array_equal(np.asarray(image_from_array(pixels.astype(np.float32), config)), want)
    assert np.array_equal(np.asarray(image_from_array(pixels.astype(np.int64), config)), want)
    clipped = np.asarray(image_from_array(np.array([[-5.0, 300.0, 2.0]]), config))
    assert clipped.tolist() == [[0, 255, 2]]
    assert np.asarray(image_from_array(np.array([[-7, 999]], dtype=np.int32), config)).tolist() == [[0, 255]]


@pytest.mark.parametrize(
    'array, reason',
    [
        (np.zeros(10, np.uint8), 'shape'),
        (np.zeros((2, 4, 4, 3), np.uint8), 'shape'),
        (np.zeros((4, 4, 2), np.uint8), '2 channels'),
        (np.zeros((3, 224, 224), np.uint8), '224 channels'),
        (np.zeros((0, 4, 3), np.uint8), 'empty'),
        (np.zeros((4, 4, 3), bool), 'dtype bool'),
        (np.zeros((4, 4, 3), complex), 'dtype complex'),
        (np.array([['a', 'b']]), 'dtype'),
        (np.array([[0.5, np.nan]]), 'NaN'),
        (np.array([[0.5, np.inf]]), 'NaN or infinite'),
        (np.zeros((10, 2010), np.uint8), 'aspect ratio'),
    ],
    ids=['rank1', 'rank4', 'two_channels', 'chw', 'empty', 'bool', 'complex', 'str', 'nan', 'inf', 'aspect'],
)
def test_bad_tensors_raise_image_error(array, reason):
    with pytest.raises(ImageError, match=reason):
        image_from_array(array, PreprocessConfig())


# ---------------------------------------------------------------------------
# imports


def test_importing_preprocess_does_not_import_torch():
    code = (
        'import sys, clipserve.models.preprocess\n'
        "print(','.join(m for m in ('torch', 'torchvision', 'open_clip') if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ''


def test_module_itself_imports_only_stdlib_numpy_pillow():
    """Preprocessing (and the resampler it uses) without the package root: NumPy and Pillow only."""
    assert third_party_imports('clipserve.models.preprocess') <= {'numpy', 'PIL'}
