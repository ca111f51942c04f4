"""models/resample.py, the memory guard's windowed resize: the same bytes as Pillow's whole-image resize
followed by the crop, computed for the kept window only; and why it is clipserve's own and not Pillow's."""

import numpy as np
from PIL import Image

from clipserve.models import preprocess as pp
from clipserve.models import resample
from clipserve.models.preprocess import PreprocessConfig, preprocess_image

from .images import noise_pixels, noise_rgb


def test_windowed_resize_is_byte_exact_against_pillow():
    """Pillow's resize + crop vs our window-only transcription, across modes, sizes and filters."""
    rule = resample.calibrated_pass_order()
    print(f'\n[preprocess] pass-order rule for Pillow {Image.__version__}: {getattr(rule, "__name__", None)}')
    assert rule is not None, 'windowed resize disagrees with this Pillow; the memory guard is off'
    sizes = [
        (2, 3),
        (7, 5),
        (225, 224),
        (640, 480),
        (386, 923),
        (923, 386),
        (1023, 17),
        (17, 1023),
        (2000, 10),
        (3000, 40),
        (40, 3000),
        (263, 1220),
    ]
    mismatches, cases = [], 0
    for width, height in sizes:
        base = noise_pixels(width, height, 4, seed=width + height)
        base[:, : max(width // 4, 1), 3] = 0
        for mode in ('RGB', 'RGBA', 'L', 'LA', 'CMYK'):
            image = Image.fromarray(base).convert(mode) if mode != 'RGBA' else Image.fromarray(base)
            for size in (224, 288):
                new_size = pp._shortest_side_size(width, height, size)
                crop = pp._center_crop_box(*new_size, size)
                for interpolation in ('bicubic', 'bilinear'):
                    cases += 1
                    want = np.asarray(image.resize(new_size, resample.RESAMPLE[interpolation]).crop(crop))
                    got = np.asarray(resample.resize_crop_exact(image, new_size, crop, interpolation, rule))
                    if not np.array_equal(want, got):
                        mismatches.append((width, height, mode, size, interpolation))
    print(f'[preprocess] windowed resize vs Pillow: {cases} cases, {len(mismatches)} with any byte different')
    assert not mismatches


def test_memory_guard_never_resizes_the_whole_image(monkeypatch):
    produced = []
    real_resize = Image.Image.resize

    def spy(self, size, *args, **kwargs):
        produced.append(tuple(size))
        return real_resize(self, size, *args, **kwargs)

    resample.calibrated_pass_order()  # calibration resizes small probes; keep them out of the record
    monkeypatch.setattr(Image.Image, 'resize', spy)
    out = preprocess_image(noise_rgb(20000, 100, 13), PreprocessConfig())
    assert out.shape == (3, 224, 224)
    assert all(w * h <= 224 * 224 for w, h in produced), produced


def test_pillows_own_windowed_resize_is_not_the_same_bytes_so_clipserve_keeps_its_own():
    """Why resample.py exists: Pillow's own way to resize only a window (`resize(size, box=...)`) gives other
    bytes than its whole-image resize followed by the crop (it takes the box edges as float32, and its pass
    order follows the window's shape), so the memory guard would change what a replica embeds for elongated
    images (by up to 11 of 255 levels on a 40x3000 strip here). Should this test fail, Pillow's box resize has become exact:
    replace resize_crop_exact with it and delete resample.py."""
    rule = resample.calibrated_pass_order()
    assert rule is not None
    differing = []
    for width, height in [(40, 3000), (263, 1220), (923, 386), (5000, 300)]:
        image = noise_rgb(width, height, seed=width)
        new_size = pp._shortest_side_size(width, height, 224)
        left, top, right, bottom = crop = pp._center_crop_box(*new_size, 224)
        scale_x, scale_y = width / new_size[0], height / new_size[1]
        box = (left * scale_x, top * scale_y, right * scale_x, bottom * scale_y)
        for interpolation, filter_ in resample.RESAMPLE.items():
            want = np.asarray(image.resize(new_size, filter_).crop(crop))
            pillow_window = np.asarray(image.resize((right - left, bottom - top), filter_, box=box))
            ours = np.asarray(resample.resize_crop_exact(image, new_size, crop, interpolation, rule))
            assert np.array_equal(ours, want), (width, height, interpolation)
            if not np.array_equal(pillow_window, want):
                differing.append((width, height, interpolation, int(np.abs(pillow_window - want.astype(int)).max())))
    print(f'\n[resample] Pillow box= resize differs from resize + crop in {len(differing)} of 8 cases: {differing}')
    assert differing, "Pillow's box= resize now equals resize + crop: use it instead of resample.py"
