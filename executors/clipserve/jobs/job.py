"""One bulk job, whatever runs it: its options, its plan, which shards are still to do, and how a part's
per-row results become a shard. The local engine and the Ray engine both build on this, which is why
their outputs are the same files.

A row is embedded or it fails with a reason; a shard's embeddings and metadata hold exactly the rows that
were embedded (in input order), its errors file the rest. Texts are needed for every row when captions
are embedded, so a row without one fails (saying how to embed the images alone) rather than leaving a
hole in text_emb.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clipserve.jobs.bridge import UriPolicy
from clipserve.jobs.readers import InputError, Plan, Row, plan_input
from clipserve.jobs.writers import ShardWriter, finish, metadata_row

MODALITIES = ('auto', 'images', 'texts', 'both')
NO_CAPTION = 'no caption for this row (embed the images alone with --modality images)'


@dataclass(frozen=True)
class JobOptions:
    input: str
    output: str
    model: str = 'ViT-B-32::openai'
    backend: str = 'torch'
    device: str | None = None
    dtype: str | None = None
    model_path: str | None = None
    input_format: str | None = None
    modality: str = 'auto'
    image_column: str | None = None
    caption_column: str | None = None
    shard_size: int = 10_000
    batch_size: int | None = None
    workers: int | None = None
    threads: int | None = None
    output_dtype: str = 'fp16'
    normalize: bool = True
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int | None = None
    remote_timeout: float = 10.0
    allowed_hosts: tuple[str, ...] = ()
    fetch_threads: int = 8
    engine: str = 'local'
    address: str | None = None
    actors: int | None = None
    actor_cpus: float | None = None  # None: 1 with a GPU, else 2 (ray_engine._resources)
    actor_gpus: float | None = None  # None: 1 where the cluster has GPUs
    server: str | None = None
    token: str | None = None
    quiet: bool = False
    extra: dict = field(default_factory=dict)

    def policy(self) -> UriPolicy:
        """The server's URI policy with the bulk job's opt-ins: the user's own files, and remote URLs to public
        addresses (or the hosts named with --allow-host), with the server's timeout and size limits."""
        return UriPolicy(
            allow_local_files=True,
            allow_remote=True,
            remote_timeout=self.remote_timeout,
            max_bytes=self.max_image_bytes,
            allowed_hosts=tuple(self.allowed_hosts),
        )

    def on_gpu(self) -> bool:
        return bool(self.device) and str(self.device).startswith('cuda')

    def resolved_batch(self) -> int:
        return self.batch_size or (256 if self.on_gpu() else 32)

    def resolved_threads(self) -> int | None:
        """The model's CPU threads: on a CPU, the cores the decoding workers leave (OpenMP threads that share
        a core with a busy worker wait on each other at every barrier: several times slower)."""
        if self.threads is not None or self.on_gpu() or self.server:
            return self.threads
        return max(1, _cores() - self.resolved_workers())

    def resolved_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        cores = _cores()
        # a GPU leaves the CPU to decoding; a CPU model needs most cores itself
        return max(1, cores - 1) if (self.on_gpu() or self.server) else max(1, cores // 4)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1)


@dataclass
class Job:
    options: JobOptions
    plan: Plan
    images: bool
    texts: bool
    writer: ShardWriter

    @property
    def pending(self):
        return [part for part in self.plan.parts if not self.writer.done(part.index)]

    def manifest(self, model: str, precision: str | None) -> dict:
        o = self.options
        return {
            'input': os.path.abspath(o.input) if '{' not in o.input else o.input,
            'format': self.plan.kind,
            'fingerprint': self.plan.fingerprint(),
            'parts': len(self.plan.parts),
            'rows': self.plan.rows,
            'shard_size': o.shard_size,
            'modality': 'both' if self.images and self.texts else 'images' if self.images else 'texts',
            'model': model,
            'precision': precision,
            'output_dtype': o.output_dtype,
            'normalize': o.normalize,
            'layout': 'clip-retrieval: img_emb/img_emb_{i}.npy, text_emb/text_emb_{i}.npy, '
            'metadata/metadata_{i}.parquet (aligned rows); errors/errors_{i}.parquet (failed rows)',
        }

    def check_row(self, row: Row) -> Row:
        """A row that cannot be embedded whatever its image (no caption where captions are embedded) fails now."""
        if self.texts and row.error is None and not (row.caption or '').strip():
            return dataclasses.replace(row, error=NO_CAPTION)
        return row


def prepare(options: JobOptions) -> Job:
    if options.modality not in MODALITIES:
        raise InputError(f'--modality must be one of {", ".join(MODALITIES)}, got {options.modality!r}')
    if options.shard_size < 1:
        raise InputError(f'--shard-size must be at least 1, got {options.shard_size}')
    plan = plan_input(
        options.input, options.input_format, options.shard_size, options.image_column, options.caption_column
    )
    modality = options.modality
    if modality == 'auto':
        modality = 'both' if plan.has_captions else 'images'
    if modality in ('texts', 'both') and not plan.has_captions:
        raise InputError(
            f'--modality {modality}: {plan.description} has no captions (same-stem .txt files, a caption column, '
            'or txt members); use --modality images'
        )
    images, texts = modality in ('images', 'both'), modality in ('texts', 'both')
    writer = ShardWriter(Path(options.output), len(plan.parts), images, texts, options.output_dtype)
    return Job(options, plan, images, texts, writer)


class PartResult:
    """Per-row outcome of one part as it is computed: error, size, and the row's vectors once known."""

    def __init__(self, rows: list[Row]):
        self.rows = rows
        self.errors: list[str | None] = [row.error for row in rows]
        self.widths: list[int | None] = [None] * len(rows)
        self.heights: list[int | None] = [None] * len(rows)
        self.img: list[np.ndarray | None] = [None] * len(rows)
        self.txt: list[np.ndarray | None] = [None] * len(rows)

    def fail(self, i: int, reason: str) -> None:
        if self.errors[i] is None:
            self.errors[i] = reason

    def shard(self, job: Job, dim: int):
        """(metadata, errors, img_emb, text_emb) of the shard: embedded rows aligned, failed rows apart."""
        metadata, errors, img, txt = [], [], [], []
        for i, row in enumerate(self.rows):
            if self.errors[i] is None and job.images and self.img[i] is None:
                self.errors[i] = 'no image embedding was computed for this row'
            if self.errors[i] is None and job.texts and self.txt[i] is None:
                self.errors[i] = 'no text embedding was computed for this row'
            entry = metadata_row(row.position, row.source, row.caption, self.widths[i], self.heights[i], self.errors[i])
            if self.errors[i] is not None:
                errors.append(entry)
                continue
            metadata.append(entry)
            img.append(self.img[i])
            txt.append(self.txt[i])
        normalize = job.options.normalize
        img_emb = finish(np.stack(img) if img else np.zeros((0, dim), np.float32), normalize) if job.images else None
        text_emb = finish(np.stack(txt) if txt else np.zeros((0, dim), np.float32), normalize) if job.texts else None
        return metadata, errors, img_emb, text_emb


def write_part(job: Job, index: int, result: PartResult, dim: int) -> tuple[int, int]:
    """Write part `index`'s shard; (rows embedded, rows failed)."""
    metadata, errors, img_emb, text_emb = result.shard(job, dim)
    job.writer.write(index, metadata, errors, img_emb, text_emb)
    return len(metadata), len(errors)
