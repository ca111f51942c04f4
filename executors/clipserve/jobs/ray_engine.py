"""The Ray engine (`--engine ray [--address ...]`): the local engine's steps as Ray Data stages, for
collections that one machine would take too long over.

    parts -> read (tasks: a part's rows) -> decode (tasks: bytes to pixels) -> embed (a fixed pool of actors,
    each loading the model once) -> write (one actor on the driver's node: complete shards, atomically)

The plan, the resume check, the per-row rules and the shard writer are the local engine's (job.py,
writers.py), so both engines write the same files. Rows reach the writer in any order; it holds each part's
rows until the part is complete (its row count is known from the plan), puts them back in input order and
writes the shard, so memory holds only the parts in flight. The writer runs on the driver's node, so the
output folder need only exist there; inputs must be readable from every node (shared storage or URLs).
Ray must be importable: `pip install 'clipserve[ray]'`.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np

from clipserve.jobs.bridge import load_model, pixel_shape
from clipserve.jobs.decode import NONE, PIXELS, DecodeSettings, decode_rows
from clipserve.jobs.job import Job, PartResult, write_part
from clipserve.jobs.progress import Progress
from clipserve.jobs.ray_compat import hide_pydantic_v1_from_ray, worker_setup
from clipserve.jobs.readers import Row, read_part
from clipserve.jobs.writers import check_manifest

ROW_COLUMNS = ('part', 'position', 'source', 'caption', 'error')


def _objects(values) -> np.ndarray:
    values = list(values)
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _text(value) -> str | None:
    """A string cell as Ray hands it back: None stays None (a column of nulls may come back as NaN)."""
    if value is None or (isinstance(value, (float, np.floating)) and value != value):
        return None
    return value if isinstance(value, str) else str(value)


def _blob(value) -> bytes | None:
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else None


def _node() -> str:
    """The Ray node this runs on: the summary counts the nodes that did work."""
    import ray

    return ray.get_runtime_context().get_node_id()


def _rows_batch(index: int, rows: list[Row]) -> dict:
    return {
        'part': np.full(len(rows), index, dtype=np.int64),
        'position': np.array([r.position for r in rows], dtype=np.int64),
        'source': _objects(r.source for r in rows),
        'caption': _objects(r.caption for r in rows),
        'data': _objects(r.data for r in rows),
        'uri': _objects(r.uri for r in rows),
        'error': _objects(r.error for r in rows),
    }


def read_parts(batch: dict, job: Job, size: int):
    """Stage 1: the rows of each part in the batch (parts travel pickled), `size` rows per output batch."""
    for blob in batch['part']:
        part = pickle.loads(blob)
        chunk: list[Row] = []
        for row in read_part(job.plan.kind, part):
            chunk.append(job.check_row(row))
            if len(chunk) == size:
                yield _rows_batch(part.index, chunk)
                chunk = []
        if chunk:
            yield _rows_batch(part.index, chunk)


def decode_batch(batch: dict, settings: DecodeSettings, shape: tuple[int, ...]) -> dict:
    """Stage 2: decode_rows over the batch; failed rows get zero pixels and their error."""
    rows = [
        Row(int(p), _text(s) or '', _text(c), data=_blob(d), uri=_text(u), error=_text(e))
        for p, s, c, d, u, e in zip(*(batch[k] for k in ('position', 'source', 'caption', 'data', 'uri', 'error')))
    ]
    decoded = decode_rows(rows, settings)
    out = {k: batch[k] for k in ('part', 'position', 'source', 'caption')}
    out['error'] = _objects(decoded.errors)
    out['width'] = np.array([-1 if w is None else w for w in decoded.widths], dtype=np.int64)
    out['height'] = np.array([-1 if h is None else h for h in decoded.heights], dtype=np.int64)
    out['node'] = _objects([_node()] * len(rows))
    if settings.mode == PIXELS:
        pixels = np.zeros((len(rows), *shape), dtype=np.float32)
        if decoded.pixels is not None:
            pixels[decoded.ok] = decoded.pixels
        out['pixels'] = pixels
    return out


class EmbedActor:
    """Stage 3: one model per actor, loaded once; embeds the batch's rows that have no error."""

    def __init__(self, options, images: bool, texts: bool):
        o = options
        self.model = load_model(
            o.backend, o.model, o.device, o.dtype, o.model_path, o.resolved_batch(), o.max_image_pixels, o.threads
        )
        self.images, self.texts = images, texts
        self.node = _node()

    def __call__(self, batch: dict) -> dict:
        n, dim = len(batch['position']), self.model.embed_dim
        ok = [i for i, error in enumerate(batch['error']) if _text(error) is None]
        out = {k: batch[k] for k in (*ROW_COLUMNS, 'width', 'height')}
        if self.images:
            out['img_emb'] = np.zeros((n, dim), np.float32)
            if ok:
                out['img_emb'][ok] = self.model.encode_images(np.ascontiguousarray(batch['pixels'][ok]))
        if self.texts:
            out['text_emb'] = np.zeros((n, dim), np.float32)
            if ok:
                out['text_emb'][ok] = self.model.encode_texts([_text(batch['caption'][i]) for i in ok])
        out['node'] = _objects(f'{decoded_on},{self.node}' for decoded_on in batch['node'])
        return out


class WriterActor:
    """Stage 4: collects each part's rows (in any order, once each) and writes the part's shard when whole."""

    def __init__(self, job: Job, counts: dict[int, int], dim: int):
        self.job, self.counts, self.dim = job, counts, dim
        self.pending: dict[int, dict[int, tuple]] = {}

    def __call__(self, batch: dict) -> dict:
        touched = set()
        for i in range(len(batch['position'])):
            part = int(batch['part'][i])
            img = batch['img_emb'][i].copy() if 'img_emb' in batch else None
            txt = batch['text_emb'][i].copy() if 'text_emb' in batch else None
            w, h = int(batch['width'][i]), int(batch['height'][i])
            row = Row(
                int(batch['position'][i]),
                _text(batch['source'][i]) or '',
                _text(batch['caption'][i]),
                error=_text(batch['error'][i]),
            )
            self.pending.setdefault(part, {})[row.position] = (
                row,
                None if w < 0 else w,
                None if h < 0 else h,
                img,
                txt,
            )
            touched.add(part)
        shards = failed = 0
        for part in sorted(touched):
            if len(self.pending[part]) < self.counts[part]:
                continue
            entries = [self.pending[part][position] for position in sorted(self.pending[part])]
            del self.pending[part]
            result = PartResult([e[0] for e in entries])
            result.widths = [e[1] for e in entries]
            result.heights = [e[2] for e in entries]
            result.img = [e[3] if e[0].error is None else None for e in entries]
            result.txt = [e[4] if e[0].error is None else None for e in entries]
            _, errors = write_part(self.job, part, result, self.dim)
            shards, failed = shards + 1, failed + errors
        n = len(batch['position'])
        ok = sum(_text(e) is None for e in batch['error'])
        nodes = sorted({node for nodes in batch['node'] for node in str(nodes).split(',')}) if 'node' in batch else []
        return {
            'rows': np.array([n]),
            'errors': np.array([failed]),
            'images': np.array([ok if self.job.images else 0]),
            'texts': np.array([ok if self.job.texts else 0]),
            'shards': np.array([shards]),
            'nodes': _objects([','.join(nodes)]),
        }


def _probe(options):
    """What the driver needs from the model before the stages start, computed where the model would run."""
    o = options
    model = load_model(
        o.backend, o.model, o.device, o.dtype, o.model_path, o.resolved_batch(), o.max_image_pixels, o.threads
    )
    try:
        return model.preprocess, model.embed_dim, model.description, getattr(model.backend, 'dtype', None)
    finally:
        model.close()


def _resources(options, cluster: dict) -> tuple[int, float, float]:
    gpus = float(cluster.get('GPU', 0))
    cpus = float(cluster.get('CPU', 1))
    actor_gpus = options.actor_gpus if options.actor_gpus is not None else (1.0 if gpus >= 1 else 0.0)
    actor_cpus = options.actor_cpus if options.actor_cpus is not None else (1.0 if actor_gpus else 2.0)
    if options.actors:
        return options.actors, actor_cpus, actor_gpus
    actors = int(gpus // actor_gpus) if actor_gpus else int(cpus // (2 * actor_cpus))
    return max(1, actors), actor_cpus, actor_gpus


def run_ray(job: Job) -> dict:
    hide_pydantic_v1_from_ray()
    import ray
    import ray.data

    o = job.options
    started_here = not ray.is_initialized()
    if started_here:
        # the job's workers run this Python (clipserve, its model runtimes), whichever one started the cluster
        runtime_env = {
            'py_executable': sys.executable,
            'worker_process_setup_hook': f'{worker_setup.__module__}.worker_setup',
            # clipserve's own switches (CLIPSERVE_CPU_BF16, ...) as the driver has them, so every worker
            # loads the model as the driver's probe did
            'env_vars': {k: v for k, v in os.environ.items() if k.startswith('CLIPSERVE_')},
        }
        ray.init(address=o.address or None, include_dashboard=False, log_to_driver=not o.quiet, runtime_env=runtime_env)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        actors, actor_cpus, actor_gpus = _resources(o, ray.cluster_resources())
        remote = dict(num_cpus=actor_cpus, num_gpus=actor_gpus)
        preprocess, dim, description, precision = ray.get(ray.remote(**remote)(_probe).remote(o))
        check_manifest(Path(o.output), job.manifest(o.model, precision))
        pending = job.pending
        skipped = job.plan.rows - sum(p.count for p in pending)
        progress = Progress(sum(p.count for p in pending), skipped, len(pending), quiet=o.quiet)
        if not o.quiet:
            print(
                f'clipserve embed: {job.plan.description} -> {o.output}: {len(pending)} of {len(job.plan.parts)} '
                f'shards to do, on Ray ({actors} actors of {description})',
                file=sys.stderr,
            )
        nodes: set[str] = set()
        for part in [p for p in pending if not p.count]:  # an empty tar: an empty shard, no stage needed
            write_part(job, part.index, PartResult([]), dim)
            progress.update(0, 0, 0, 0, shards=1)
        pending = [p for p in pending if p.count]
        if pending:
            batch = o.resolved_batch()
            settings = DecodeSettings(preprocess, o.policy(), PIXELS if job.images else NONE, o.fetch_threads)
            light = Job(
                o, type(job.plan)(job.plan.kind, [], job.plan.has_captions, ''), job.images, job.texts, job.writer
            )
            ds = ray.data.from_items([{'part': pickle.dumps(p)} for p in pending], override_num_blocks=len(pending))
            ds = ds.map_batches(read_parts, batch_size=1, fn_kwargs={'job': light, 'size': batch}, num_cpus=1)
            ds = ds.map_batches(
                decode_batch,
                batch_size=batch,
                num_cpus=1,
                fn_kwargs={'settings': settings, 'shape': pixel_shape(preprocess)},
            )
            ds = ds.map_batches(
                EmbedActor,
                batch_size=batch,
                compute=ray.data.ActorPoolStrategy(size=actors),
                fn_constructor_kwargs={'options': o, 'images': job.images, 'texts': job.texts},
                **remote,
            )
            this_node = {'ray.io/node-id': ray.get_runtime_context().get_node_id()}
            ds = ds.map_batches(
                WriterActor,
                batch_size=None,
                compute=ray.data.ActorPoolStrategy(size=1),
                fn_constructor_kwargs={'job': light, 'counts': {p.index: p.count for p in pending}, 'dim': dim},
                num_cpus=0,
                label_selector=this_node,
            )
            for summary in ds.iter_batches(batch_size=None, batch_format='numpy'):
                for k in range(len(summary['rows'])):
                    progress.update(
                        int(summary['rows'][k]),
                        int(summary['errors'][k]),
                        int(summary['images'][k]),
                        int(summary['texts'][k]),
                        shards=int(summary['shards'][k]),
                    )
                    nodes.update(n for n in str(summary['nodes'][k]).split(',') if n)
        progress.close()
        return progress.summary() | {
            'engine': 'ray',
            'output': o.output,
            'model': description,
            'actors': actors,
            'nodes_used': len(nodes),
        }
    finally:
        if started_here:
            ray.shutdown()
