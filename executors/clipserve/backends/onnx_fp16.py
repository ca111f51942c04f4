"""fp16 copies of ONNX graphs for CUDA, converted once and cached; safe with many replicas starting together.

Each copy is a directory `<cache>/onnx-fp16/<name>-<key>/` holding `model.onnx`, its weights as
external data (`model.onnx.data`, so towers over protobuf's 2 GB work) and `integrity.json` (sizes and
sha256 of both). It is written in a unique temporary directory and renamed into place, under a file
lock so concurrent replicas convert once; a copy whose files no longer match `integrity.json` (a
crash, a full disk, a hand edit) is rejected, removed and converted again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from clipserve.models.cache import cache_dir

MODEL_FILE = 'model.onnx'
DATA_FILE = 'model.onnx.data'
INTEGRITY_FILE = 'integrity.json'
FORMAT = 1  # bump when the conversion changes, so cached copies are redone

logger = logging.getLogger(__name__)


def fp16_copy(source: Path) -> Path:
    """The fp16 copy of the ONNX graph `source` (inputs and outputs stay float32), converting it if needed."""
    source = Path(source).resolve()
    target = _target_dir(source)
    if _verified(target):
        return target / MODEL_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + '.lock')):
        if _verified(target):  # another replica converted it while this one waited
            return target / MODEL_FILE
        if target.exists():
            logger.warning('the cached fp16 copy %s is incomplete or corrupt; converting %s again', target, source)
            shutil.rmtree(target)
        logger.info('converting %s to fp16 into %s (once; later starts reuse it)', source, target)
        work = Path(tempfile.mkdtemp(prefix=f'.{target.name}-', dir=target.parent))
        try:
            convert_to_fp16(source, work / MODEL_FILE)
            _write_integrity(work)
            os.rename(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target / MODEL_FILE


def convert_to_fp16(source: Path, destination: Path) -> None:
    """Convert from the file path: shape inference runs on files (in memory it stops at 2 GB) and the
    result is always saved with external data."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    inferred = destination.with_name('inferred.onnx')
    onnx.shape_inference.infer_shapes_path(str(source), str(inferred))
    model = onnx.load(str(inferred), load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(source.parent))
    inferred.unlink()
    converted = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=True)
    del model
    onnx.save_model(
        converted, str(destination), save_as_external_data=True, all_tensors_to_one_file=True, location=DATA_FILE
    )


def _target_dir(source: Path) -> Path:
    stat = source.stat()
    data = source.with_name(source.name + '.data')
    identity = f'{source}:{stat.st_size}:{stat.st_mtime_ns}|format={FORMAT}'
    if data.is_file():
        identity += f'|{data.stat().st_size}:{data.stat().st_mtime_ns}'
    return cache_dir() / 'onnx-fp16' / f'{source.stem}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}'


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write_integrity(folder: Path) -> None:
    files = {
        name: {'bytes': (folder / name).stat().st_size, 'sha256': _digest(folder / name)}
        for name in (MODEL_FILE, DATA_FILE)
        if (folder / name).is_file()
    }
    (folder / INTEGRITY_FILE).write_text(json.dumps({'format': FORMAT, 'files': files}, indent=2))


def _verified(folder: Path) -> bool:
    """True when every file listed in integrity.json is there with its size and sha256."""
    try:
        record = json.loads((folder / INTEGRITY_FILE).read_text())
        files = record['files']
        if record.get('format') != FORMAT or MODEL_FILE not in files:
            return False
        for name, expected in files.items():
            path = folder / name
            if path.stat().st_size != expected['bytes'] or _digest(path) != expected['sha256']:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


@contextmanager
def _locked(path: Path):
    """An exclusive advisory lock across processes (released when the process dies, too)."""
    with open(path, 'a') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
