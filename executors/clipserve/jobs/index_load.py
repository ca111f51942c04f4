"""`python -m clipserve index DIR --into PATH | --qdrant-url URL`: load what `embed` wrote into a search index.

Reads clip-retrieval's layout (embed's output: writers.py) shard by shard, `img_emb/` (or `text_emb/` with
`--vectors text`) with the aligned rows of `metadata/`, into the embedded Qdrant engine's folder that
flows/search.yml serves (CLIPSERVE_INDEX_PATH), or into a collection of a Qdrant server. A document's id is
its image's URL or path (else `<shard>:<row>`), its payload the caption (`text`), the URL or path (`uri`)
and the rest of its metadata (`tags`: width, height, position, shard), so search answers show them.

Resumable: writes are idempotent (the same rows give the same points) and each loaded shard is recorded in
`.index-progress-<target>.json` in DIR; a rerun loads only the shards not recorded. The embedded index
builds its search graph once at the end (minutes for millions of vectors: shown).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from clipserve.errors import ClipServeError
from clipserve.index.points import Point
from clipserve.index.store import CollectionSettings, VectorStore
from clipserve.jobs.progress import ProgressLine
from clipserve.jobs.writers import MANIFEST

VECTOR_FOLDERS = {'image': 'img_emb', 'text': 'text_emb'}
TAG_COLUMNS = ('width', 'height', 'position')


class LoadError(ValueError):
    """Something a user can fix: a folder that is not embed's output, a missing extra, an unreachable index."""


def parser(prog: str = 'clipserve index') -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Load embed's output (img_emb/, text_emb/, metadata/) into a search index, resumably.",
    )
    p.add_argument('folder', help='the folder `python -m clipserve embed` wrote')
    add_target_arguments(p)
    p.add_argument('--quiet', '-q', action='store_true', help='no progress bar')
    return p


def add_target_arguments(p: argparse.ArgumentParser, flag: str = '--into') -> None:
    t = p.add_argument_group('the index')
    t.add_argument(
        flag, dest='into', metavar='PATH', help='the embedded index folder (what CLIPSERVE_INDEX_PATH names)'
    )
    t.add_argument('--qdrant-url', help='a Qdrant server instead (http://host:6333)')
    t.add_argument(
        '--collection', default='clipserve', help='the collection on the Qdrant server (default %(default)s)'
    )
    t.add_argument('--qdrant-api-key', help="the Qdrant server's API key")
    t.add_argument('--vectors', default='image', choices=sorted(VECTOR_FOLDERS), help='which embeddings to index')
    t.add_argument(
        '--metric',
        default='cosine',
        choices=('cosine', 'euclidean', 'inner_product'),
        help='how a new index compares vectors (default %(default)s; an existing one keeps its own)',
    )
    t.add_argument(
        '--quantization',
        default='none',
        choices=('none', 'int8'),
        help='int8: a new index also keeps its vectors as int8 for searching (a quarter of the memory)',
    )


def open_target(args) -> tuple[VectorStore, str]:
    """(the store, a name for the progress file) the arguments name."""
    settings = CollectionSettings(metric=args.metric, quantization=args.quantization)
    if bool(args.into) == bool(args.qdrant_url):
        raise LoadError('name exactly one index: --into PATH (embedded) or --qdrant-url URL (a Qdrant server)')
    if args.qdrant_url:
        from clipserve.index.server import ServerStore

        return ServerStore(
            args.qdrant_url, args.collection, settings, args.qdrant_api_key
        ), f'{args.qdrant_url}/{args.collection}'
    from clipserve.index.edge import EdgeStore

    return EdgeStore(args.into, settings), str(Path(args.into).resolve())


def shards(folder: Path, vectors: str) -> list[tuple[str, Path, Path]]:
    """(shard number as written, vectors file, metadata file) of every complete shard, in order."""
    if not (folder / MANIFEST).is_file():
        raise LoadError(f'{folder} is not the output of `python -m clipserve embed` (no {MANIFEST})')
    name = VECTOR_FOLDERS[vectors]
    found = []
    for meta in sorted((folder / 'metadata').glob('metadata_*.parquet')):
        number = meta.stem.split('_', 1)[1]
        emb = folder / name / f'{name}_{number}.npy'
        if emb.is_file():
            found.append((number, emb, meta))
    if not found:
        raise LoadError(f'{folder} holds no {vectors} embeddings ({name}/): embed with that modality first')
    return found


def points_of_shard(number: str, embeddings: np.ndarray, metadata: list[dict]) -> list[Point]:
    points = []
    for row, (vector, meta) in enumerate(zip(embeddings, metadata)):
        source = meta.get('url') or meta.get('image_path') or ''
        payload = {'tags': {k: meta[k] for k in TAG_COLUMNS if meta.get(k) is not None} | {'shard': number}}
        if meta.get('caption'):
            payload['text'] = meta['caption']
        if source:
            payload['uri'] = source
        points.append(Point(source or f'{number}:{row}', np.asarray(vector, dtype=np.float32), payload))
    return points


def load(folder: Path, store: VectorStore, target: str, vectors: str, quiet: bool = False) -> dict:
    import pyarrow.parquet as pq

    progress_file = folder / f'.index-progress-{hashlib.sha1(f"{target}|{vectors}".encode()).hexdigest()[:12]}.json'
    done = set(json.loads(progress_file.read_text())['shards']) if progress_file.exists() else set()
    todo = [s for s in shards(folder, vectors) if s[0] not in done]
    started, rows = time.perf_counter(), 0
    bar = ProgressLine(len(todo), 'shards', quiet)
    for number, emb, meta in todo:
        embeddings = np.load(emb)
        metadata = pq.read_table(meta).to_pylist()
        if len(metadata) != len(embeddings):
            raise LoadError(f'{emb.name} has {len(embeddings)} rows and {meta.name} {len(metadata)}: not one shard')
        for at in range(0, len(embeddings), 1000):
            store.upsert(points_of_shard(number, embeddings[at : at + 1000], metadata[at : at + 1000]))
        rows += len(embeddings)
        done.add(number)
        progress_file.write_text(json.dumps({'target': target, 'vectors': vectors, 'shards': sorted(done)}))
        bar.advance(1)
    bar.close()
    return {
        'loaded_rows': rows,
        'loaded_shards': len(todo),
        'skipped_shards': len(done) - len(todo),
        'seconds': time.perf_counter() - started,
    }


def run(args) -> dict:
    folder = Path(args.folder)
    store, target = open_target(args)
    try:
        summary = load(folder, store, target, args.vectors, args.quiet)
        if summary['loaded_rows'] and hasattr(store, 'unindexed'):
            if not args.quiet:
                print(f'clipserve index: building the search graph of {store.count():,} vectors...', file=sys.stderr)
            started = time.perf_counter()
            store.optimize()
            summary['graph_seconds'] = time.perf_counter() - started
        summary['count'] = store.count()
        summary['index'] = target
        return summary
    finally:
        store.close()


def main(argv: list[str]) -> dict:
    return load_command(parser().parse_args(argv))


def load_command(args) -> dict:
    """The load the parsed arguments describe, with its summary printed (`clipserve index`)."""
    try:
        summary = run(args)
    except (LoadError, ClipServeError, OSError) as error:
        print(f'clipserve index: {error}', file=sys.stderr)
        raise SystemExit(2)
    print(
        f'clipserve index: {summary["loaded_rows"]:,} rows from {summary["loaded_shards"]} shards '
        f'({summary["skipped_shards"]} loaded before) into {summary["index"]}: {summary["count"]:,} documents; '
        f'{summary["seconds"] + summary.get("graph_seconds", 0):.1f} s',
        file=sys.stderr,
    )
    return summary
