"""Converted copies of ONNX graphs (fp16 for CUDA, int8 for CPUs), made once and cached; safe with many
replicas starting together.

Each copy is a directory `<cache>/onnx-<kind>/<name>-<key>/` holding `model.onnx`, its weights as
external data (`model.onnx.data`, so towers over protobuf's 2 GB work) and `integrity.json` (sizes and
sha256 of its files). It is written in a unique temporary directory and renamed into place, under a
file lock so concurrent replicas convert once; a copy whose files no longer match `integrity.json` (a
crash, a full disk, a hand edit) is rejected, removed and converted again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock

from clipserve.models.cache import cache_dir

MODEL_FILE = 'model.onnx'
DATA_FILE = 'model.onnx.data'
INTEGRITY_FILE = 'integrity.json'

logger = logging.getLogger(__name__)


def converted_copy(source: Path, kind: str, convert: Callable[[Path, Path], None], version: int) -> Path:
    """The `kind` copy of the ONNX graph `source`, made by `convert(source, destination)` if needed.

    `version` is the conversion's format: bump it when the conversion changes, so cached copies are redone.
    """
    source = Path(source).resolve()
    target = _target_dir(source, kind, version)
    if _verified(target, version):
        return target / MODEL_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + '.lock')):  # across processes; released if one dies
        if _verified(target, version):  # another replica converted it while this one waited
            return target / MODEL_FILE
        if target.exists():
            logger.warning('the cached %s copy %s is incomplete or corrupt; converting %s again', kind, target, source)
            shutil.rmtree(target)
        logger.info('converting %s to %s into %s (once; later starts reuse it)', source, kind, target)
        work = Path(tempfile.mkdtemp(prefix=f'.{target.name}-', dir=target.parent))
        try:
            convert(source, work / MODEL_FILE)
            _write_integrity(work, version)
            os.rename(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target / MODEL_FILE


def _target_dir(source: Path, kind: str, version: int) -> Path:
    stat = source.stat()
    data = source.with_name(source.name + '.data')
    identity = f'{source}:{stat.st_size}:{stat.st_mtime_ns}|format={version}'
    if data.is_file():
        identity += f'|{data.stat().st_size}:{data.stat().st_mtime_ns}'
    return cache_dir() / f'onnx-{kind}' / f'{source.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}'


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_integrity(folder: Path, version: int) -> None:
    files = {
        path.name: {'bytes': path.stat().st_size, 'sha256': _digest(path)}
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != INTEGRITY_FILE
    }
    (folder / INTEGRITY_FILE).write_text(json.dumps({'format': version, 'files': files}, indent=2))


def _verified(folder: Path, version: int) -> bool:
    """True when every file listed in integrity.json is there with its size and sha256."""
    try:
        record = json.loads((folder / INTEGRITY_FILE).read_text())
        files = record['files']
        if record.get('format') != version or MODEL_FILE not in files:
            return False
        for name, expected in files.items():
            path = folder / name
            if path.stat().st_size != expected['bytes'] or _digest(path) != expected['sha256']:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True
