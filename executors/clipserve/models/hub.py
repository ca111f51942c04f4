"""Files from the Hugging Face hub, kept in clipserve's cache: found there offline, downloaded once otherwise.

huggingface_hub decides whether a download may happen (offline mode: `HF_HUB_OFFLINE`, read when it is
imported, refuses at once) and how it fails; its failure becomes one line of reason (HubFileUnavailable),
which the caller turns into a message saying what to copy where. Our own: a 3 s connect to the hub before
a download, because huggingface_hub retries an unreachable hub 5 times with backoff (23 s, more where
packets are dropped) and no setting shortens that.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from pathlib import Path

from clipserve.models.cache import cache_dir

PROBE_TIMEOUT = 3.0  # seconds
PROXY_VARIABLES = ('HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy')


class HubFileUnavailable(RuntimeError):
    """The file is not in the cache and cannot be downloaded now; `str()` says why."""


def _unreachable() -> str | None:
    """Why the hub cannot be reached now (offline mode is huggingface_hub's to handle), else None."""
    from huggingface_hub import constants

    if constants.is_offline_mode() or any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None  # huggingface_hub refuses at once; a proxy decides (let the download try)
    parts = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=PROBE_TIMEOUT).close()
        return None
    except OSError as e:
        return f'{parts.hostname} is unreachable and the cache has no copy ({e})'


def reason(error: Exception) -> str:
    """Why a download failed, in a line: offline mode, or huggingface_hub's own error."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return 'HF_HUB_OFFLINE is set and the cache has no copy'
    return f'{type(error).__name__}: {error}'


def cached_file(repo: str, filename: str) -> Path | None:
    """`repo`'s `filename` if clipserve's cache holds it; touches no network."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id=repo, filename=filename, cache_dir=str(cache_dir()))
    return Path(path) if isinstance(path, str) and os.path.isfile(path) else None


def hub_file(repo: str, filenames: tuple[str, ...] | list[str]) -> Path:
    """The first of `filenames` that `repo` has: from the cache, else downloaded into it."""
    for name in filenames:
        found = cached_file(repo, name)
        if found:
            return found
    why = _unreachable()
    if why:
        raise HubFileUnavailable(why)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    missing = []
    for name in filenames:
        try:
            return Path(hf_hub_download(repo_id=repo, filename=name, cache_dir=str(cache_dir())))
        except RemoteEntryNotFoundError:  # the repository has no such file: the next name
            missing.append(name)
        except Exception as e:  # offline, network, hub and file-system errors all end here
            raise HubFileUnavailable(reason(e)) from e
    raise HubFileUnavailable(f'the repository has none of {", ".join(missing)}')


def hub_snapshot(repo: str, patterns: list[str], required: str) -> Path:
    """The folder of `repo`'s files matching `patterns` (which must include `required`), cached or downloaded."""
    found = cached_file(repo, required)
    if found:
        return found.parent
    why = _unreachable()
    if why:
        raise HubFileUnavailable(why)
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id=repo, allow_patterns=patterns, cache_dir=str(cache_dir())))
    except Exception as e:  # offline, network, hub and file-system errors all end here
        raise HubFileUnavailable(reason(e)) from e
    if not (folder / required).is_file():
        raise HubFileUnavailable(f'the repository has no {required}')
    return folder
