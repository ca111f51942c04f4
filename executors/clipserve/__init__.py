"""clipserve: CLIP embeddings and cross-modal ranking as Jina executors, a bulk embedder, and their engine.

The packages are layers, each importing only the ones below it (docs/development.md):
errors -> inputs -> models -> backends -> engine -> config -> serving (Jina) and jobs (bulk) -> __main__.

`from clipserve import Model` is a model in this process, for embeddings without a server (engine/model.py).
`from clipserve import CLIPEncoder, CLIPRanker, CLIPIndexer, CrossEncoderRanker` defines the executors (the
reranker in the v1 flavour), for the DocArray flavour installed
(serving/jina/flavour.py: v1, clip-as-service's wire, in serving/replica/executors.py; v2, typed documents, in
serving/replica/executors_v2.py; any other combination of docarray and pydantic fails, naming both installs).
A Flow YAML's `py_modules: [clipserve.serving]` makes Jina import this package (not `[clipserve]`: Jina looks a
py_modules name up as a file first, in the folders of its call stack and on PATH, where it would find the
`clipserve` command and fail to import it; serving/jina/compat.py), and Jina finds `uses: CLIPEncoder`
(and the gateways `ReadyGateway`, `ClipServeGateway`) only once their classes are defined: when Jina is
already imported, importing the package defines them at once. Otherwise (a bulk job, a Ray worker, the command line)
they are defined on first use, so `import clipserve` pulls in neither Jina nor DocArray, nor any
backend's runtime.
"""

import os
import sys

from clipserve.config.version import __version__

# Secure by default: no events posted to Jina AI's telemetry server from processes serving clipserve.
os.environ.setdefault('JINA_OPTOUT_TELEMETRY', '1')

_SERVING = {
    'CLIPEncoder': 'executors',
    'CLIPRanker': 'executors',
    'CLIPIndexer': 'indexer',
    'CrossEncoderRanker': 'replica.reranker',
    'ReadyGateway': 'gateway.gateways',
    'ClipServeGateway': 'gateway.gateways',
}


def __getattr__(name: str):
    if name == 'Model':  # the engine in this process, without Jina (engine/model.py)
        from clipserve.engine.model import Model

        return Model
    if name in _SERVING:
        from importlib import import_module

        from clipserve.serving.jina import flavour

        kind = _SERVING[name]
        modules = {'executors': flavour.executors_module, 'indexer': flavour.indexer_module}
        module = modules[kind]() if kind in modules else f'clipserve.serving.{kind}'
        return getattr(import_module(module), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


if 'jina' in sys.modules:  # loaded by Jina (py_modules): register the executors and gateways now
    from clipserve.serving.jina.flavour import installed as _flavour  # noqa: E402

    if _flavour() == 'v2':  # DocArray v2: Jina's gateway models fixed for pydantic >= 2.11 before any app is built
        from clipserve.serving.replica.executors_v2 import CLIPEncoder, CLIPRanker  # noqa: E402, F401
        from clipserve.serving.replica.indexer_v2 import CLIPIndexer  # noqa: E402, F401
    else:
        from clipserve.serving.replica.executors import CLIPEncoder, CLIPRanker  # noqa: E402, F401
        from clipserve.serving.replica.indexer import CLIPIndexer  # noqa: E402, F401
        from clipserve.serving.replica.reranker import CrossEncoderRanker  # noqa: E402, F401
    from clipserve.serving.gateway.gateways import ClipServeGateway, ReadyGateway  # noqa: E402, F401

__all__ = [
    'Model',
    'CLIPEncoder',
    'CLIPRanker',
    'CLIPIndexer',
    'CrossEncoderRanker',
    'ReadyGateway',
    'ClipServeGateway',
    '__version__',
]
