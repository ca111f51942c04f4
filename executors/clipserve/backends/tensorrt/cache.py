"""Whether a cached TensorRT engine may be loaded: cache keys (ONNX hash, TensorRT version, GPU, precision,
profiles), paths, atomic writes with a sidecar, staleness, one build at a time under a lock; and the
ONNX export engines are built from. Plain Python; unit-tested without TensorRT."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from filelock import FileLock

from clipserve.errors import EngineBuildError
from clipserve.models.cache import cache_dir

ENGINE_FORMAT = 1  # bump when what goes into an engine changes (builder flags, profiles), so caches rebuild

logger = logging.getLogger(__name__)


# ---- cache keys and paths ---------------------------------------------------------------------


def onnx_sha256(onnx_file: Path) -> str:
    """sha256 over the graph and its external-data file, if any: the engine depends on both."""
    digest = hashlib.sha256()
    for part in (onnx_file, onnx_file.with_name(onnx_file.name + '.data')):
        if part.is_file():
            digest.update(part.name.encode() + b'\0')
            with open(part, 'rb') as f:
                for chunk in iter(lambda: f.read(1 << 20), b''):
                    digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class EngineKey:
    """Everything a serialized engine depends on. An engine built under another key must not be loaded:
    engines are specific to the TensorRT version and the GPU model, and cannot run other shapes."""

    tower: str
    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    precision: str
    profile: str
    engine_format: int = ENGINE_FORMAT

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()


def engine_cache_dir() -> Path:
    return cache_dir() / 'tensorrt'


def engine_path(key: EngineKey, root: Path | None = None) -> Path:
    """One file per key: different GPUs or TensorRT versions sharing a cache never overwrite each other."""
    return (root or engine_cache_dir()) / f'{key.tower}-{key.precision}-{key.digest()[:20]}.engine'


def sidecar_path(engine_file: Path) -> Path:
    return engine_file.with_suffix('.json')


def timing_cache_path(tensorrt_version: str, gpu_name: str, compute_capability: str, root: Path | None = None) -> Path:
    """Timing caches are valid for one GPU model and TensorRT version (not per model or precision)."""
    slug = re.sub(r'[^A-Za-z0-9._-]+', '-', f'{gpu_name}-sm{compute_capability}-trt{tensorrt_version}').strip('-')
    return (root or engine_cache_dir()) / f'timing-{slug}.cache'


# ---- engine files -----------------------------------------------------------------------------


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write beside the target and rename, so a crash or a concurrent reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_engine(engine_file: Path, key: EngineKey, blob: bytes) -> None:
    """Save the engine, then its sidecar; a crash between the two leaves a mismatch, i.e. a rebuild."""
    atomic_write(engine_file, blob)
    sidecar = {'key': key.as_dict(), 'engine_bytes': len(blob), 'engine_sha256': hashlib.sha256(blob).hexdigest()}
    atomic_write(sidecar_path(engine_file), json.dumps(sidecar, indent=2).encode())


def stale_reason(engine_file: Path, key: EngineKey) -> str | None:
    """Why the cached engine must be rebuilt instead of loaded, or None when it may be loaded.

    TensorRT can crash or misbehave on engines from another version or GPU, so the sidecar's key and
    the file's size and hash are checked before TensorRT ever sees the bytes.
    """
    if not engine_file.is_file():
        return 'no cached engine'
    sidecar = sidecar_path(engine_file)
    if not sidecar.is_file():
        return f'{sidecar.name} is missing'
    try:
        recorded = json.loads(sidecar.read_text())
        recorded_key = recorded['key']
        size, sha = int(recorded['engine_bytes']), str(recorded['engine_sha256'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f'{sidecar.name} is unreadable ({type(e).__name__}: {e})'
    wanted = key.as_dict()
    differing = [f.name for f in fields(EngineKey) if recorded_key.get(f.name) != wanted[f.name]]
    if differing:
        return 'it was built for another ' + ', '.join(
            f'{name} ({recorded_key.get(name)!r}, now {wanted[name]!r})' for name in differing
        )
    actual = engine_file.stat().st_size
    if actual != size:
        return f'the engine file has {actual} bytes, its sidecar says {size} (truncated or replaced)'
    if _file_sha256(engine_file) != sha:
        return 'the engine file does not match the sha256 in its sidecar (corrupt or replaced)'
    return None


def _build_lock(engine_file: Path) -> FileLock:
    """Replicas on one machine share the cache: only one of them builds an engine, the others then load it."""
    engine_file.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(engine_file.with_suffix('.lock'))


def load_or_build(engine_file: Path, key: EngineKey, deserialize, build):
    """The cached engine when it is fresh and TensorRT accepts it; otherwise a new build, saved for next time.

    `deserialize(bytes)` returns an engine or None (TensorRT's convention) and may raise; `build()`
    returns the serialized engine. Returns (engine, why it was built, or None when loaded from the cache).
    """
    with _build_lock(engine_file):
        reason = stale_reason(engine_file, key)
        if reason is None:
            try:
                engine = deserialize(engine_file.read_bytes())
            except Exception as e:  # TensorRT raises on some corrupt plans and returns None on others
                engine, reason = None, f'TensorRT could not deserialize it ({e})'
            if engine is not None:
                logger.info('loaded the cached %s engine %s', key.tower, engine_file)
                return engine, None
            reason = reason or 'TensorRT could not deserialize it'
        logger.warning(
            'building the %s TensorRT engine (%s); this takes minutes once, later starts load %s',
            key.tower,
            reason,
            engine_file,
        )
        blob = build()
        write_engine(engine_file, key, blob)
    engine = deserialize(blob)
    if engine is None:
        raise EngineBuildError(f'TensorRT built the {key.tower} engine but could not deserialize it ({engine_file})')
    return engine, reason
