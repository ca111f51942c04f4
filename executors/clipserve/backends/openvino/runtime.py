"""OpenVINO, imported without its usage telemetry. The openvino backend's modules import it from here.

`import openvino` sends a usage event to Intel's analytics (openvino-telemetry, which counts a missing
consent file as consent) from a child process that it starts for the purpose, which also fixes the
importing process's multiprocessing start method to fork (Jina's Flows then cannot start their
executors in fresh interpreters). A serving replica does neither: before OpenVINO is first imported, the
telemetry package is marked unimportable (`sys.modules[name] = None`, as lean_imports.py does for
Triton), and OpenVINO then falls back to its own stub that sends nothing.
"""

from __future__ import annotations

import sys

if 'openvino' not in sys.modules:  # once imported, the event has gone out already
    sys.modules.setdefault('openvino_telemetry', None)

import openvino as ov  # noqa: E402
import openvino.opset13 as opset  # noqa: E402

__all__ = ['ov', 'opset']
