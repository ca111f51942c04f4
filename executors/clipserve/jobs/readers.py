"""What a bulk job reads: the input's kind, its division into parts (one part = one output shard), and
the rows of a part, for every input clip-retrieval's users have.

Inputs: a folder of images with optional same-stem `.txt` captions (clip-retrieval's "files"), a text file
of paths or URLs (one a line, optionally `<TAB>caption`), a CSV/TSV or parquet table (a file or a folder of
them) with an image column (paths, URLs or image bytes, incl. Hugging Face's {bytes, path} structs) and an
optional caption column, and webdataset `.tar` shards (a file, a folder, or `name-{0000..0099}.tar`).
The plan is made once, by the driver, from cheap facts (a listing, the tables' row counts, the tars'
headers), so that part i holds the same rows on every run: that is what lets a rerun skip finished shards
and lets Ray workers read their parts independently. Reading yields rows lazily (a tar part never sits in
memory whole); a row that cannot be read (a caption file that does not decode, a sample with no image)
carries its error and is never dropped silently.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.webp', '.bmp', '.gif', '.tif', '.tiff')
FORMATS = ('files', 'list', 'csv', 'parquet', 'webdataset')
IMAGE_COLUMNS = ('image', 'url', 'image_path', 'path', 'filepath', 'file', 'jpg', 'img')
TAR_IMAGE_FIELDS = ('jpg', 'jpeg', 'png', 'webp', 'bmp', 'gif', 'tif', 'tiff')
CAPTION_COLUMNS = ('caption', 'text', 'txt', 'title', 'alt')
_BRACES = re.compile(r'\{(\d+)\.\.(\d+)\}')


class InputError(ValueError):
    """The input cannot be planned (missing, empty, no such column); the message names it and what to do."""


@dataclass(frozen=True)
class Row:
    """One item of the input. Its image is `data` where the input carries the bytes (tars, parquet), else
    read from `uri` (a path or URL) under the job's URI policy; with neither, the row has no image."""

    position: int  # the row's place in the whole input, from 0
    source: str  # what the metadata names: path, URL, `shard.tar#key`, `table.parquet#row`
    caption: str | None
    data: bytes | None = None
    uri: str | None = None
    error: str | None = None  # found while reading; the row is then written as failed


@dataclass(frozen=True)
class Part:
    """Rows [first, first + count) of the input, read by `spec` (plain data, so it travels to Ray workers)."""

    index: int
    first: int
    count: int
    spec: tuple


@dataclass(frozen=True)
class Plan:
    kind: str
    parts: list[Part]
    has_captions: bool
    description: str

    @property
    def rows(self) -> int:
        return sum(part.count for part in self.parts)

    def fingerprint(self) -> str:
        """Changes when any part would hold other rows: a rerun into the same output must match it."""
        digest = hashlib.sha256(self.kind.encode())
        for part in self.parts:
            digest.update(repr((part.index, part.first, part.count, part.spec)).encode())
        return digest.hexdigest()[:16]


def detect_format(path: str) -> str:
    if _BRACES.search(path) or path.lower().endswith('.tar'):
        return 'webdataset'
    p = Path(path)
    if p.is_dir():
        names = [n.lower() for n in os.listdir(p)]
        if any(n.endswith(IMAGE_EXTENSIONS) for n in names) or any((p / n).is_dir() for n in os.listdir(p)):
            return 'files'
        for ext, kind in (('.tar', 'webdataset'), ('.parquet', 'parquet'), ('.csv', 'csv'), ('.tsv', 'csv')):
            if any(n.endswith(ext) for n in names):
                return kind
        return 'files'
    suffix = p.suffix.lower()
    return {'.parquet': 'parquet', '.csv': 'csv', '.tsv': 'csv'}.get(suffix, 'list')


def plan_input(
    path: str,
    input_format: str | None = None,
    shard_size: int = 10_000,
    image_column: str | None = None,
    caption_column: str | None = None,
) -> Plan:
    """Parts of `path` of at most `shard_size` rows (webdataset: one part per tar)."""
    if not _BRACES.search(path) and not os.path.exists(path):
        raise InputError(f'input {path!r} does not exist')
    kind = input_format or detect_format(path)
    if kind not in FORMATS:
        raise InputError(f'unknown input format {kind!r}; choose one of {", ".join(FORMATS)}')
    if kind == 'files':
        plan = _plan_files(path, shard_size)
    elif kind == 'list':
        plan = _plan_list(path, shard_size)
    elif kind == 'csv':
        plan = _plan_csv(path, shard_size, image_column, caption_column)
    elif kind == 'parquet':
        plan = _plan_parquet(path, shard_size, image_column, caption_column)
    else:
        plan = _plan_tars(path)
    if not plan.rows:
        raise InputError(f'input {path!r} ({kind}) has no rows to embed')
    return plan


def _chunked(kind: str, items: list, shard_size: int, has_captions: bool, description: str, head=()) -> Plan:
    parts = [
        Part(i, start, len(items[start : start + shard_size]), (*head, tuple(items[start : start + shard_size])))
        for i, start in enumerate(range(0, len(items), shard_size))
    ]
    return Plan(kind, parts, has_captions, description)


def _plan_files(folder: str, shard_size: int) -> Plan:
    root = os.path.abspath(folder)
    items, captions = [], 0
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        names = set(files)
        for name in sorted(files):
            stem, ext = os.path.splitext(name)
            if ext.lower() in IMAGE_EXTENSIONS:
                has_caption = f'{stem}.txt' in names
                captions += has_caption
                items.append((os.path.relpath(os.path.join(directory, name), root), has_caption))
    return _chunked('files', items, shard_size, captions > 0, f'folder {root} ({len(items)} images)', head=(root,))


def _plan_list(path: str, shard_size: int) -> Plan:
    base = os.path.dirname(os.path.abspath(path))
    items = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            line = line.rstrip('\r\n')
            if not line.strip() or line.lstrip().startswith('#'):
                continue
            source, _, caption = line.partition('\t')
            items.append((_absolute(source.strip(), base), caption if _ else None))
    captions = any(caption is not None for _, caption in items)
    return _chunked('list', items, shard_size, captions, f'list {path} ({len(items)} rows)')


def _absolute(source: str, base: str) -> str:
    """Paths relative to the list or table file's folder; URLs and absolute paths as they are."""
    if '://' in source or source.startswith('data:') or os.path.isabs(source) or not source:
        return source
    return os.path.normpath(os.path.join(base, os.path.expanduser(source)))


def _table_files(path: str, extensions: tuple[str, ...]) -> list[str]:
    if os.path.isdir(path):
        return sorted(str(p) for p in Path(path).iterdir() if p.suffix.lower() in extensions)
    return [path]


def _pick(columns: list[str], asked: str | None, choices: tuple[str, ...], what: str, where: str) -> str | None:
    if asked:
        if asked not in columns:
            raise InputError(f'{where} has no column {asked!r} for the {what}; its columns: {", ".join(columns)}')
        return asked
    return next((c for c in choices if c in columns), None)


def _plan_csv(path: str, shard_size: int, image_column: str | None, caption_column: str | None) -> Plan:
    items, image_col, caption_col = [], None, None
    for file in _table_files(path, ('.csv', '.tsv')):
        base = os.path.dirname(os.path.abspath(file))
        with open(file, encoding='utf-8', newline='') as f:
            reader = csv.DictReader(f, delimiter='\t' if file.lower().endswith('.tsv') else ',')
            columns = list(reader.fieldnames or [])
            image_col = _pick(columns, image_column, IMAGE_COLUMNS, 'images', file)
            caption_col = _pick(columns, caption_column, CAPTION_COLUMNS, 'captions', file)
            if image_col is None and caption_col is None:
                raise InputError(
                    f'{file} has neither an image column ({", ".join(IMAGE_COLUMNS)}) nor a caption column '
                    f'({", ".join(CAPTION_COLUMNS)}); name them with --image-column / --caption-column'
                )
            for record in reader:
                source = (record.get(image_col) or '').strip() if image_col else ''
                items.append((_absolute(source, base), record.get(caption_col) if caption_col else None))
    return _chunked('csv', items, shard_size, caption_col is not None, f'table {path} ({len(items)} rows)')


def _plan_parquet(path: str, shard_size: int, image_column: str | None, caption_column: str | None) -> Plan:
    import pyarrow.parquet as pq

    parts, first, has_captions = [], 0, False
    for file in _table_files(path, ('.parquet',)):
        meta = pq.ParquetFile(file)
        columns = meta.schema_arrow.names
        image_col = _pick(columns, image_column, IMAGE_COLUMNS, 'images', file)
        caption_col = _pick(columns, caption_column, CAPTION_COLUMNS, 'captions', file)
        if image_col is None and caption_col is None:
            raise InputError(
                f'{file} has neither an image column ({", ".join(IMAGE_COLUMNS)}) nor a caption column '
                f'({", ".join(CAPTION_COLUMNS)}); name them with --image-column / --caption-column'
            )
        has_captions |= caption_col is not None
        rows = meta.metadata.num_rows
        for start in range(0, rows, shard_size):
            count = min(shard_size, rows - start)
            parts.append(Part(len(parts), first, count, (os.path.abspath(file), start, image_col, caption_col)))
            first += count
    return Plan('parquet', parts, has_captions, f'parquet {path} ({first} rows)')


def expand_braces(pattern: str) -> list[str]:
    """webdataset's `name-{000..123}.tar` (zero padding kept), without the braceexpand package."""
    match = _BRACES.search(pattern)
    if not match:
        return [pattern]
    low, high = match.group(1), match.group(2)
    width = len(low) if low.startswith('0') else 0
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [p for n in range(int(low), int(high) + 1) for p in expand_braces(f'{head}{str(n).zfill(width)}{tail}')]


def _sample_key(name: str) -> tuple[str, str]:
    """webdataset's grouping: the key is the path up to the first dot of the file name, the rest its field."""
    directory, _, base = name.rpartition('/')
    stem, _, field = base.partition('.')
    return (f'{directory}/{stem}' if directory else stem), field.lower()


def _tar_samples(path: str) -> Iterator[tuple[str, dict[str, tarfile.TarInfo]]]:
    """(key, {field: member}) per sample, in the tar's order; headers only (data is skipped by seeking)."""
    with tarfile.open(path, 'r:') as tar:
        yield from _samples(tar)


def _plan_tars(path: str) -> Plan:
    if _BRACES.search(path):
        tars = expand_braces(path)
    elif os.path.isdir(path):
        tars = sorted(glob.glob(os.path.join(path, '*.tar')))
    else:
        tars = [path]
    parts, first, has_captions = [], 0, False
    for tar in tars:
        if not os.path.isfile(tar):
            raise InputError(f'webdataset shard {tar!r} does not exist')
        try:
            samples = list(_tar_samples(tar))
        except (tarfile.TarError, OSError) as e:
            raise InputError(f'webdataset shard {tar!r} is not a readable tar file: {e}') from None
        has_captions |= any('txt' in fields for _, fields in samples)
        parts.append(Part(len(parts), first, len(samples), (os.path.abspath(tar),)))
        first += len(samples)
    return Plan('webdataset', parts, has_captions, f'webdataset {path} ({len(tars)} shards, {first} samples)')


# ---- reading a part -----------------------------------------------------------------------------


def read_part(kind: str, part: Part) -> Iterator[Row]:
    """The rows of `part`, in order, exactly `part.count` of them."""
    if kind == 'files':
        root, items = part.spec
        for offset, (relpath, has_caption) in enumerate(items):
            path = os.path.join(root, relpath)
            caption, error = _caption_file(os.path.splitext(path)[0] + '.txt') if has_caption else (None, None)
            yield Row(part.first + offset, path, caption, uri=path, error=error)
    elif kind in ('list', 'csv'):
        (items,) = part.spec
        for offset, (source, caption) in enumerate(items):
            yield Row(part.first + offset, source, caption, uri=source or None)
    elif kind == 'parquet':
        yield from _parquet_rows(part)
    elif kind == 'webdataset':
        yield from _tar_rows(part)
    else:
        raise InputError(f'unknown input format {kind!r}')


def _caption_file(path: str) -> tuple[str | None, str | None]:
    try:
        with open(path, encoding='utf-8') as f:
            return f.read().strip(), None
    except (OSError, UnicodeDecodeError) as e:
        return None, f'cannot read the caption file {path}: {e}'


def _parquet_rows(part: Part) -> Iterator[Row]:
    """The part's rows, reading only the row groups that hold them (a big file is read once over all its parts)."""
    import pyarrow.parquet as pq

    file, start, image_col, caption_col = part.spec
    columns = [c for c in (image_col, caption_col) if c]
    table = pq.ParquetFile(file)
    groups, offset, seen = [], 0, 0  # seen: rows of the row groups before the first one read
    for g in range(table.metadata.num_row_groups):
        rows = table.metadata.row_group(g).num_rows
        if offset + rows <= start:
            seen += rows
        elif offset < start + part.count:
            groups.append(g)
        else:
            break
        offset += rows
    position = part.first
    for batch in table.iter_batches(batch_size=1024, columns=columns, row_groups=groups):
        lo = max(0, start - seen)
        hi = min(batch.num_rows, start + part.count - seen)
        if hi > lo:
            images = batch.column(image_col).to_pylist()[lo:hi] if image_col else [None] * (hi - lo)
            captions = batch.column(caption_col).to_pylist()[lo:hi] if caption_col else [None] * (hi - lo)
            for image, caption in zip(images, captions):
                yield _table_row(position, image, caption, file)
                position += 1
        seen += batch.num_rows
        if seen >= start + part.count:
            return


def _table_row(position: int, image, caption, file: str) -> Row:
    if caption is not None and not isinstance(caption, str):
        caption = str(caption)
    if isinstance(image, dict):  # Hugging Face datasets' Image feature: {'bytes': ..., 'path': ...}
        data, source = image.get('bytes'), image.get('path') or ''
        if data:
            return Row(position, source or f'{file}#{position}', caption, data=bytes(data))
        image = source
    if isinstance(image, (bytes, bytearray)):
        return Row(position, f'{file}#{position}', caption, data=bytes(image))
    source = '' if image is None else _absolute(str(image).strip(), os.path.dirname(file))
    return Row(position, source, caption, uri=source or None)


def _tar_rows(part: Part) -> Iterator[Row]:
    (path,) = part.spec
    position = part.first
    with tarfile.open(path, 'r:') as tar:
        for key, fields in _samples(tar):
            source = f'{path}#{key}'
            image = next((fields[f] for f in TAR_IMAGE_FIELDS if f in fields), None)
            caption = error = data = None
            if 'txt' in fields:
                try:
                    caption = tar.extractfile(fields['txt']).read().decode('utf-8').strip()
                except UnicodeDecodeError as e:
                    error = f'the caption {key}.txt is not UTF-8 text: {e}'
            if image is not None:
                data = tar.extractfile(image).read()
            yield Row(position, source, caption, data=data, error=error)
            position += 1


def _samples(tar: tarfile.TarFile) -> Iterator[tuple[str, dict[str, tarfile.TarInfo]]]:
    """Consecutive members with one key make a sample (members' data is read by seeking, when asked)."""
    key, fields = None, {}
    for member in tar:
        if not member.isfile():
            continue
        k, field = _sample_key(member.name)
        if k != key and key is not None:
            yield key, fields
            fields = {}
        key = k
        fields[field] = member
    if key is not None:
        yield key, fields
