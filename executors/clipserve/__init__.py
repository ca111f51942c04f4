"""clipserve: CLIP embeddings and cross-modal ranking as Jina executors.

Importing the package defines (and so registers with Jina) `CLIPEncoder` and `CLIPRanker`, which
is what `py_modules: [clipserve]` in a Flow YAML relies on. Backends are imported only when an
executor selects one, so `import clipserve` never pulls in torch or onnxruntime.
"""

import os

__version__ = '0.1.0'

# Secure by default: no events posted to Jina AI's telemetry server from processes serving clipserve.
os.environ.setdefault('JINA_OPTOUT_TELEMETRY', '1')

from clipserve.encoder import CLIPEncoder  # noqa: E402
from clipserve.ranker import CLIPRanker  # noqa: E402

__all__ = ['CLIPEncoder', 'CLIPRanker', '__version__']
