"""Which DocArray flavour this environment serves, read from the installed distributions (nothing imported).

docarray v1 (0.21) and v2 (>= 0.40) share one import name, so one environment serves one of them:
- v1: clip-as-service's wire, which clip-client 0.8.3 speaks; Jina's HTTP/WebSocket gateways need pydantic 1;
- v2: `DocList` and typed documents (schemas.py); pydantic 2, up to the newest (compat.py fixes Jina's
  gateway models for pydantic >= 2.11).
Any other combination fails when clipserve's executors or gateways are defined, with the two install commands.
"""

from __future__ import annotations

from importlib import metadata

INSTALL_V1 = "pip install -c constraints.txt 'clipserve[onnx,docarray-v1]'"
INSTALL_V2 = "pip install -c constraints-v2.txt 'clipserve[onnx,docarray-v2]'"


class FlavourError(ImportError):
    """The installed docarray / pydantic (/ clip-client) are not one of the two flavours clipserve serves."""


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _release(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or '0').split('.')[:3]:
        digits = ''.join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def problem(docarray: str | None, pydantic: str | None, clip_client: str | None = None) -> str | None:
    """What is wrong with this combination of installed versions, or None when it is one flavour."""
    if docarray is None:
        return 'docarray is not installed'
    if pydantic is None:
        return 'pydantic is not installed'
    d, p = _release(docarray), _release(pydantic)
    if d < (0, 30):
        if p >= (2,):
            return (
                f'docarray {docarray} (the v1 flavour) with pydantic {pydantic}: the v1 flavour needs pydantic 1 '
                "(Jina's HTTP and WebSocket gateways build docarray 0.21's pydantic-1 models)"
            )
        return None
    if d < (0, 40):
        return f'docarray {docarray}: the v2 flavour needs docarray >= 0.40'
    if p < (2,):
        return f'docarray {docarray} (the v2 flavour) with pydantic {pydantic}: the v2 flavour needs pydantic 2'
    if clip_client is not None:
        return (
            f'clip-client {clip_client} with docarray {docarray}: clip-client speaks the v1 wire only '
            '(docarray 0.21); serve it from a v1 environment, and v2 clients from this one'
        )
    return None


def message(reason: str) -> str:
    return (
        f'clipserve cannot serve this environment: {reason}. Install one DocArray flavour per environment:\n'
        f'  v1 (clip-as-service wire, clip-client 0.8.3, docarray 0.21, pydantic 1):  {INSTALL_V1}\n'
        f'  v2 (DocList and typed documents, docarray >= 0.40, pydantic 2):           {INSTALL_V2}\n'
        '(with torch instead of onnx to serve PyTorch models; docs/docarray-v2.md)'
    )


def installed() -> str:
    """'v1' or 'v2': the flavour the installed docarray and pydantic make; FlavourError naming both installs."""
    docarray, pydantic = _version('docarray'), _version('pydantic')
    reason = problem(docarray, pydantic, _version('clip-client'))
    if reason:
        raise FlavourError(message(reason))
    return 'v1' if _release(docarray) < (0, 30) else 'v2'


def require(flavour: str) -> None:
    """Refuse to define one flavour's executors in the other flavour's environment."""
    found = installed()
    if found != flavour:
        raise FlavourError(message(f'these are the {flavour} executors, and this environment is {found}'))


def executors_module() -> str:
    """The module that defines CLIPEncoder and CLIPRanker for the installed flavour."""
    return 'clipserve.serving.replica.executors' if installed() == 'v1' else 'clipserve.serving.replica.executors_v2'


def indexer_module() -> str:
    """The module that defines CLIPIndexer for the installed flavour."""
    return 'clipserve.serving.replica.indexer' if installed() == 'v1' else 'clipserve.serving.replica.indexer_v2'
