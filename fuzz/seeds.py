"""Write a small seed corpus of real image files (PNG, JPEG, GIF, WebP, BMP, TIFF; odd modes) to fuzz/corpus/."""

import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 255, (6, 9, 3), dtype=np.uint8))
    variants = {
        'rgb.png': (rgb, 'PNG'),
        'rgb.jpg': (rgb, 'JPEG'),
        'rgb.webp': (rgb, 'WEBP'),
        'rgb.bmp': (rgb, 'BMP'),
        'rgb.tiff': (rgb, 'TIFF'),
        'rgba.png': (rgb.convert('RGBA'), 'PNG'),
        'l.png': (rgb.convert('L'), 'PNG'),
        'p.gif': (rgb.convert('P'), 'GIF'),
        'cmyk.jpg': (rgb.convert('CMYK'), 'JPEG'),
        'i16.png': (Image.fromarray(rng.integers(0, 65535, (5, 7), dtype=np.uint16)), 'PNG'),
        'one.png': (rgb.convert('1'), 'PNG'),
    }
    for name, (image, fmt) in variants.items():
        buf = io.BytesIO()
        image.save(buf, format=fmt)
        # the harness reads its mode from the first byte: 1 = image bytes
        (out / name).write_bytes(b'\x01' + buf.getvalue())


if __name__ == '__main__':
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / 'corpus'))
