"""One clip-client (0.8.3, unchanged, at its defaults but for `batch_size`) encoding texts or JPEG files, as a
process of its own, the way separate clients are (Jina's client serialises the calls of one process's threads).

    python clip_client_run.py URL texts|images COUNT BATCH_SIZE [IMAGE_DIR]

Prints one JSON line: {"ok": true, "shape": [...], "finite": true} or {"ok": false, "error": "..."}.
"""

import json
import sys
from pathlib import Path

import numpy as np
from clip_client import Client


def main() -> None:
    url, kind, count, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if kind == 'texts':
        inputs = [f'a photo of thing number {i}' for i in range(count)]
    else:
        files = sorted(Path(sys.argv[5]).glob('*.jpg'))
        inputs = [str(files[i % len(files)]) for i in range(count)]
    try:
        out = Client(url).encode(inputs, batch_size=batch_size)
        print(json.dumps({'ok': True, 'shape': list(out.shape), 'finite': bool(np.isfinite(out).all())}))
    except Exception as error:  # the test reads why
        print(json.dumps({'ok': False, 'error': repr(error)[-800:]}))


if __name__ == '__main__':
    main()
