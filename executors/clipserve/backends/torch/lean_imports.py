"""Keep Triton, a GPU kernel compiler, out of a replica that runs PyTorch on the CPU.

PyPI's torch for Linux is the CUDA build, and it depends on Triton. open_clip imports torchvision,
whose import loads torch._dynamo, which imports Triton whenever it is installed: 75 MB of resident
memory in every replica (mostly libtriton.so), for kernels a CPU replica never compiles. Marking
the package unimportable (`sys.modules[name] = None`, Python's documented way) makes torch behave
as it does where Triton is not installed. Only the executors do this (a replica is a process of
its own); code that uses clipserve's backends directly keeps its Triton. CLIPSERVE_KEEP_TRITON=1
turns it off.
"""

from __future__ import annotations

import sys

from clipserve import environment

KEEP_ENV = environment.KEEP_TRITON.name


def keep_triton_out(device: str | None) -> bool:
    """Before the torch backend loads: make Triton unimportable if this process will run torch on
    the CPU. True when it did; False when Triton is already imported, wanted, or may be needed."""
    if environment.KEEP_TRITON.on() or 'triton' in sys.modules:
        return False
    if device in (None, '', 'auto'):
        import torch  # importing torch itself does not import Triton

        if torch.cuda.is_available():
            return False
    elif str(device) != 'cpu':
        return False
    sys.modules['triton'] = None
    return True
