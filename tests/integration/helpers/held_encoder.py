"""A CLIPEncoder that a test can hold in its constructor, one copy at a time (test-only).

`hold_dir`: while `<hold_dir>/<copy>.hold` exists, the copy named `<copy>` (Jina's runtime name with
`/` as `_`, e.g. `clip_t_shard-1_rep-0`) waits before loading, and says so in `<copy>.holding`. So a
test can keep one shard or replica provably loading while the others serve.

And while `<hold_dir>/encode.hold` exists, every encoding request, once inside the executor, writes
`<hold_dir>/encode.started.<pid>` (its first document's id) and waits: a test can hold requests provably in flight.
"""

import os
import time
from pathlib import Path

from clipserve import CLIPEncoder


class HeldCLIPEncoder(CLIPEncoder):
    # Held in __new__, before __init__: Jina runs the __init__ of the replicas of one machine one at a
    # time (a file lock per executor class), so a copy held inside __init__ would hold the others too.
    def __new__(cls, *args, hold_dir: str = '', **kwargs):
        name = str((kwargs.get('runtime_args') or {}).get('name', '')).replace('/', '_')
        hold = Path(hold_dir) / f'{name}.hold' if hold_dir else None
        if hold is not None and hold.exists():
            (Path(hold_dir) / f'{name}.holding').touch()
            deadline = time.monotonic() + 300
            while hold.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        return super().__new__(cls)

    def __init__(self, hold_dir: str = '', **kwargs):
        super().__init__(**kwargs)
        self.hold_dir = Path(hold_dir) if hold_dir else None

    def encode_documents(self, docs, drop_images, skip=None, **kwargs):
        hold_dir = getattr(self, 'hold_dir', None)  # None during the warm-up in __init__
        if hold_dir is not None and (hold_dir / 'encode.hold').exists():
            (hold_dir / f'encode.started.{os.getpid()}').write_text(docs[0].id if len(docs) else '')
            deadline = time.monotonic() + 300
            while (hold_dir / 'encode.hold').exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().encode_documents(docs, drop_images, skip, **kwargs)
