"""Files from the Hugging Face hub, kept in clipserve's cache: found there offline, downloaded once otherwise.

A download that cannot happen (offline mode, the hub unreachable) fails in seconds with the reason,
which the caller turns into a message saying what to copy where.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from pathlib import Path

from clipserve.models.cache import cache_dir


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """A quick TCP probe, so that being offline fails in seconds, not after minutes of download retries."""
    if any(os.environ.get(v) for v in ('HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy')):
        return True  # a proxy decides; let the download try
    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def why_no_download(source: str) -> str | None:
    """Why a download from `source` cannot happen now (offline mode, host unreachable), else None."""
    if os.environ.get('HF_HUB_OFFLINE', '').lower() in ('1', 'true', 'yes'):
        return 'HF_HUB_OFFLINE is set and the cache has no copy'
    if source and not _reachable(source):
        return f'{urllib.parse.urlsplit(source).hostname} is unreachable and the cache has no copy'
    return None


class HubFileUnavailable(RuntimeError):
    """The file is not in the cache and cannot be downloaded now; `str()` says why."""


def cached_file(repo: str, filename: str) -> Path | None:
    """`repo`'s `filename` if clipserve's cache holds it; touches no network."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo_id=repo, filename=filename, cache_dir=str(cache_dir()))
    return Path(path) if isinstance(path, str) and os.path.isfile(path) else None


def hub_file(repo: str, filenames: tuple[str, ...]) -> Path:
    """The first of `filenames` that `repo` has: from the cache, else downloaded into it."""
    for name in filenames:
        found = cached_file(repo, name)
        if found:
            return found
    from huggingface_hub import constants, hf_hub_download

    why = why_no_download(constants.ENDPOINT)
    if why:
        raise HubFileUnavailable(why)
    errors = []
    for name in filenames:
        try:
            return Path(hf_hub_download(repo_id=repo, filename=name, cache_dir=str(cache_dir())))
        except Exception as e:  # missing file, network and file-system errors all end here
            errors.append(f'{name}: {type(e).__name__}: {e}')
    raise HubFileUnavailable('; '.join(errors))


def hub_snapshot(repo: str, patterns: list[str], required: str) -> Path:
    """The folder of `repo`'s files matching `patterns` (which must include `required`), cached or downloaded."""
    found = cached_file(repo, required)
    if found:
        return found.parent
    from huggingface_hub import constants, snapshot_download

    why = why_no_download(constants.ENDPOINT)
    if why:
        raise HubFileUnavailable(why)
    try:
        folder = Path(snapshot_download(repo_id=repo, allow_patterns=patterns, cache_dir=str(cache_dir())))
    except Exception as e:  # network, hub and file-system errors all end here
        raise HubFileUnavailable(f'{type(e).__name__}: {e}') from e
    if not (folder / required).is_file():
        raise HubFileUnavailable(f'the repository has no {required}')
    return folder
