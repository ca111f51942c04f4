"""The output: clip-retrieval's layout, written one complete shard at a time so that a run can stop anywhere.

    DIR/img_emb/img_emb_{i}.npy        float16 or float32 [n_i, dim], L2-normalised unless asked otherwise
    DIR/text_emb/text_emb_{i}.npy      the captions' embeddings, same rows
    DIR/metadata/metadata_{i}.parquet  image_path, url, caption, position, width, height, error: same rows
    DIR/errors/errors_{i}.parquet      the rows of part i that could not be embedded, with their error (only
                                       for parts with such rows)
    DIR/embed_job.json                 what produced the folder (input, model, precision, parts)

Row k of shard i is the same item in the three aligned files, which is what autofaiss and clip-retrieval's
back end rely on (they concatenate the shards in name order; i is zero-padded, as clip-retrieval pads it,
so that name order is number order). Failed rows therefore live beside them, in errors/, never as rows
of zeros in an index. Every file is written under a hidden temporary name, flushed to disk and renamed;
the metadata file is renamed last and is what marks a shard complete, so a shard is either whole or
redone by the next run, and a rerun never duplicates or loses a row.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

MANIFEST = 'embed_job.json'
LOCK = '.embed.lock'
FOLDERS = ('img_emb', 'text_emb', 'metadata', 'errors')
COLUMNS = ('image_path', 'url', 'caption', 'position', 'width', 'height', 'error')
OUTPUT_DTYPES = {'fp16': np.float16, 'fp32': np.float32}
#: what must match for a rerun to continue a folder (the engine and the worker counts may change)
SAME_JOB_KEYS = (
    'input',
    'format',
    'fingerprint',
    'parts',
    'rows',
    'modality',
    'model',
    'precision',
    'output_dtype',
    'normalize',
)


class OutputError(ValueError):
    """The output folder belongs to another job or is in use; the message says what differs."""


def digits(parts: int) -> int:
    return len(str(max(parts, 1)))


class ShardWriter:
    def __init__(self, folder: str | Path, parts: int, images: bool, texts: bool, output_dtype: str = 'fp16'):
        self.folder = Path(folder)
        self.width = digits(parts)
        self.images, self.texts = images, texts
        self.dtype = OUTPUT_DTYPES[output_dtype]

    def path(self, kind: str, index: int) -> Path:
        suffix = '.npy' if kind.endswith('emb') else '.parquet'
        return self.folder / kind / f'{kind}_{str(index).zfill(self.width)}{suffix}'

    def done(self, index: int) -> bool:
        """Shard `index` is complete: its metadata is written last (an errors file exists only with errors)."""
        needed = ['metadata'] + ['img_emb'] * self.images + ['text_emb'] * self.texts
        return all(self.path(kind, index).is_file() for kind in needed)

    def prepare(self) -> None:
        """Create the folders this job writes (not text_emb/ for images alone, errors/ when a row fails) and
        remove temporary files a killed run left behind."""
        for kind in ['metadata'] + ['img_emb'] * self.images + ['text_emb'] * self.texts:
            (self.folder / kind).mkdir(parents=True, exist_ok=True)
        for kind in FOLDERS:
            for leftover in (self.folder / kind).glob('.*.tmp'):
                leftover.unlink(missing_ok=True)

    def write(
        self,
        index: int,
        metadata: list[dict],
        errors: list[dict],
        img_emb: np.ndarray | None,
        text_emb: np.ndarray | None,
    ) -> None:
        """Shard `index`: embeddings and metadata of the rows that worked (aligned), and the failed rows."""
        for name, emb in (('img_emb', img_emb), ('text_emb', text_emb)):
            wanted = self.images if name == 'img_emb' else self.texts
            if wanted and (emb is None or len(emb) != len(metadata)):
                raise AssertionError(
                    f'shard {index}: {name} has {None if emb is None else len(emb)} rows, metadata {len(metadata)}'
                )
        staged = []
        try:
            if self.images:
                staged.append(self._stage(self.path('img_emb', index), _npy(img_emb.astype(self.dtype))))
            if self.texts:
                staged.append(self._stage(self.path('text_emb', index), _npy(text_emb.astype(self.dtype))))
            if errors:  # a shard whose rows all worked has no errors file
                self.path('errors', index).parent.mkdir(exist_ok=True)
                staged.append(self._stage(self.path('errors', index), _parquet(errors)))
            staged.append(self._stage(self.path('metadata', index), _parquet(metadata)))  # last: marks it done
            for temporary, final in staged:
                os.replace(temporary, final)
        finally:
            for temporary, _ in staged:
                temporary.unlink(missing_ok=True)  # only still there when something failed

    @staticmethod
    def _stage(final: Path, data: bytes) -> tuple[Path, Path]:
        temporary = final.with_name(f'.{final.name}.{os.getpid()}.tmp')
        with open(temporary, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return temporary, final


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array))
    return buffer.getvalue()


def _parquet(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ('image_path', pa.string()),
            ('url', pa.string()),
            ('caption', pa.string()),
            ('position', pa.int64()),
            ('width', pa.int32()),
            ('height', pa.int32()),
            ('error', pa.string()),
        ]
    )
    table = pa.Table.from_pylist([{c: row.get(c) for c in COLUMNS} for row in rows], schema=schema)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def metadata_row(position: int, source: str, caption, width, height, error=None) -> dict:
    is_url = source[:8].lower().startswith(('http://', 'https://'))
    return {
        'image_path': None if is_url or not source else source,
        'url': source if is_url else None,
        'caption': caption,
        'position': int(position),
        'width': width,
        'height': height,
        'error': error,
    }


def finish(embeddings: np.ndarray, normalize: bool) -> np.ndarray:
    """float32 rows, scaled to unit length when asked (as clip-retrieval and /v1/embeddings give them)."""
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if not normalize or not len(embeddings):
        return embeddings
    norms = np.linalg.norm(embeddings.astype(np.float64), axis=1, keepdims=True)
    return (embeddings / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def check_manifest(folder: Path, job: dict) -> None:
    """Write the job's description, or check that the folder's matches it (a rerun continues only the same job)."""
    path = folder / MANIFEST
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except ValueError as e:
            raise OutputError(f'{path} is not valid JSON ({e}); remove it or choose another --output') from None
        refuse_another_job(folder, previous, job)
        return
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f'.{MANIFEST}.tmp'
    temporary.write_text(json.dumps(job, indent=1))
    os.replace(temporary, path)


# what the user changed, for each key of the job's description
CHANGED_BY = {
    'input': 'INPUT (another collection)',
    'format': '--input-format',
    'fingerprint': "the input's files (added, removed or changed since)",
    'parts': "the input's files (another number of parts)",
    'rows': "the input's rows (another number)",
    'shard_size': '--shard-size',
    'modality': '--modality (or captions found, or gone)',
    'model': '--model',
    'precision': '--dtype (or --backend, or another CPU/GPU)',
    'output_dtype': '--output-dtype',
    'normalize': '--no-normalize',
}


def refuse_another_job(folder: Path, previous: dict, job: dict, skip: tuple[str, ...] = ()) -> None:
    """An OutputError naming the flags (or the input) that changed since the folder's job, if any did."""
    changed = [k for k in SAME_JOB_KEYS if k not in skip and previous.get(k) != job.get(k)]
    if 'parts' in changed and previous.get('shard_size') != job.get('shard_size'):
        changed[changed.index('parts')] = 'shard_size'  # the parts are the input cut by --shard-size
    if changed:
        detail = '; '.join(
            f'{CHANGED_BY.get(k, k)}: {previous.get(k)!r} then, {job.get(k)!r} now'
            if k not in ('fingerprint',)
            else CHANGED_BY[k]
            for k in changed
        )
        raise OutputError(
            f'{folder} holds the output of another job ({detail}); a rerun continues only the same job: '
            'use another --output folder, or delete this one to start over'
        )


def check_rerun(folder: Path, job: dict) -> None:
    """Before the model loads: a rerun into a folder of another job is refused now (the precision, known once
    the model is loaded, is checked by check_manifest)."""
    path = folder / MANIFEST
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            return  # check_manifest says what is wrong with it
        refuse_another_job(folder, previous, job, skip=('precision',))


class FolderLock:
    """One run per output folder at a time (an OS file lock, released when the process ends, however)."""

    def __init__(self, folder: Path):
        from filelock import FileLock, Timeout

        folder.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(folder / LOCK, timeout=0)
        try:
            self._lock.acquire()
        except Timeout:
            raise OutputError(
                f'another embed run is writing to {folder}; wait for it or choose another --output'
            ) from None

    def release(self) -> None:
        self._lock.release()
