"""`python -m clipserve embed INPUT --output DIR ...`: the command line of bulk embedding.

It parses the options, plans the input, checks that the output folder is this job's (or new), chooses
who embeds (the model here, a Flow with --server, or a Ray cluster with --engine ray), runs, and prints a
summary. Errors a user can fix (a missing input, a column that is not there, a folder of another job, an
unreachable server) end the run with one line naming the thing and the reason, exit status 2; Ctrl-C
ends it with status 130 after the shard being written is complete or discarded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from clipserve import environment
from clipserve.config.parameters import TOKEN_ENV
from clipserve.jobs.bridge import BACKENDS
from clipserve.jobs.job import MODALITIES, JobOptions, prepare
from clipserve.jobs.readers import FORMATS, InputError
from clipserve.jobs.writers import OUTPUT_DTYPES, FolderLock, OutputError, check_manifest, check_rerun

OLD_TOKEN_ENV = environment.OLD_TOKEN.name  # this command's name for it before 0.1.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='clipserve embed',
        description="Embed a collection into clip-retrieval's layout (img_emb/, text_emb/, metadata/), resumably.",
    )
    p.add_argument(
        'input',
        help='a folder of images (+ same-stem .txt captions), a list of paths/URLs, a CSV/TSV '
        'or parquet table (file or folder), or webdataset .tar shards (file, folder, name-{000..099}.tar)',
    )
    p.add_argument('--output', '-o', required=True, help='output folder; rerun the same command to resume')
    m = p.add_argument_group('model')
    m.add_argument(
        '--model', default='ViT-B-32::openai', help='model name, as the server takes it (default %(default)s)'
    )
    m.add_argument('--backend', default='torch', choices=BACKENDS, help='the runtime that embeds (default torch)')
    m.add_argument('--device', help='cpu, cuda, cuda:1 (default: cuda when present)')
    m.add_argument('--dtype', help='model precision: fp32, fp16, bf16, int8 (default: auto, as the server chooses)')
    m.add_argument('--model-path', help='exported model folder (onnx, openvino, tensorrt backends)')
    m.add_argument(
        '--threads', type=int, help='CPU threads of the model (default: the cores the decoding workers leave)'
    )
    i = p.add_argument_group('input')
    i.add_argument('--input-format', choices=FORMATS, help='default: from the path')
    i.add_argument(
        '--modality',
        default='auto',
        choices=MODALITIES,
        help='auto: images and captions where the input has captions, else images',
    )
    i.add_argument('--image-column', help='table column of image paths, URLs or bytes')
    i.add_argument('--caption-column', help='table column of captions')
    i.add_argument(
        '--allow-host',
        action='append',
        default=[],
        metavar='HOST',
        help='fetch URLs on this host/network even when it is not public (repeatable)',
    )
    i.add_argument('--remote-timeout', type=float, default=10.0, help='seconds per URL fetch (default %(default)s)')
    i.add_argument('--max-image-bytes', type=int, default=20 * 1024 * 1024, help='default %(default)s')
    i.add_argument('--max-image-pixels', type=int, help="default: the model's (50M)")
    o = p.add_argument_group('output and speed')
    o.add_argument(
        '--shard-size',
        type=int,
        default=10_000,
        help='rows per output shard (default %(default)s; webdataset: one shard per input tar)',
    )
    o.add_argument(
        '--output-dtype',
        default='fp16',
        choices=sorted(OUTPUT_DTYPES),
        help='precision of the stored vectors (default fp16)',
    )
    o.add_argument('--no-normalize', action='store_true', help='keep raw embeddings (default: unit length)')
    o.add_argument('--batch-size', type=int, help='rows per model call (default 32 on a CPU, 256 on a GPU)')
    o.add_argument(
        '--workers',
        type=int,
        help='decoding processes (default: a quarter of the cores for a CPU '
        'model, all but one for a GPU or a server; 0 decodes in this process)',
    )
    o.add_argument('--fetch-threads', type=int, default=8, help='URL fetches at once per worker')
    o.add_argument('--quiet', '-q', action='store_true', help='no progress line')
    o.add_argument('--json', action='store_true', help='print the summary as JSON on standard output')
    r = p.add_argument_group('engines')
    r.add_argument(
        '--engine',
        default='local',
        choices=('local', 'ray'),
        help='local processes (default), or Ray Data stages on a cluster',
    )
    r.add_argument('--address', help='Ray cluster address (default: start Ray on this machine)')
    r.add_argument('--actors', type=int, help='Ray model actors (default: one per GPU, else CPUs / 4)')
    r.add_argument('--actor-cpus', type=float, default=None, help='CPUs per Ray model actor (default 2, 1 with a GPU)')
    r.add_argument(
        '--actor-gpus', type=float, default=None, help='GPUs per Ray model actor (default 1 on GPU clusters)'
    )
    r.add_argument('--server', help='embed through a running clipserve Flow (its HTTP address) instead of a model')
    r.add_argument('--token', help=f"the Flow's token (default: {TOKEN_ENV})")
    x = p.add_argument_group('search index')
    x.add_argument(
        '--index',
        metavar='PATH|URL',
        help='then load the embeddings into a search index: an embedded index folder (what flows/search.yml '
        'serves as CLIPSERVE_INDEX_PATH) or a Qdrant server URL (python -m clipserve index, in one run)',
    )
    x.add_argument(
        '--index-vectors', choices=('image', 'text'), help='which embeddings to index (default: images if any)'
    )
    return p


def token_from(args) -> str | None:
    """--token, else CLIPSERVE_AUTH_TOKEN (the server's and the clients' name), else the old CLIPSERVE_TOKEN with a
    warning."""
    if args.token:
        return args.token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    if os.environ.get(OLD_TOKEN_ENV):
        print(f'clipserve embed: {OLD_TOKEN_ENV} is deprecated: name the token {TOKEN_ENV}', file=sys.stderr)
        return os.environ[OLD_TOKEN_ENV]
    return None


def options_from(args) -> JobOptions:
    return JobOptions(
        input=args.input,
        output=args.output,
        model=args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        model_path=args.model_path,
        input_format=args.input_format,
        modality=args.modality,
        image_column=args.image_column,
        caption_column=args.caption_column,
        shard_size=args.shard_size,
        batch_size=args.batch_size,
        workers=args.workers,
        threads=args.threads,
        output_dtype=args.output_dtype,
        normalize=not args.no_normalize,
        max_image_bytes=args.max_image_bytes,
        max_image_pixels=args.max_image_pixels,
        remote_timeout=args.remote_timeout,
        allowed_hosts=tuple(args.allow_host),
        fetch_threads=args.fetch_threads,
        engine=args.engine,
        address=args.address,
        actors=args.actors,
        actor_cpus=args.actor_cpus,
        actor_gpus=args.actor_gpus,
        server=args.server,
        token=token_from(args),
        quiet=args.quiet,
    )


def _fail(message: str) -> None:
    print(f'clipserve embed: {message}', file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str]) -> dict:
    return run(parser().parse_args(argv))


def run(args) -> dict:
    """The job the parsed arguments describe (`clipserve embed` parses them with this module's parser)."""
    options = options_from(args)
    if options.server and options.engine == 'ray':
        _fail('--server and --engine ray are alternatives: the Flow is the engine')
    if options.server and not options.normalize:
        _fail("--no-normalize cannot be used with --server: the server's /v1/embeddings answers unit-length vectors")
    if not options.server:  # a mistyped model fails here, in a blink, before anything is created or loaded
        from clipserve.errors import UnknownModelError
        from clipserve.models.known_models import check_model_name

        try:
            check_model_name(options.model)
        except UnknownModelError as error:
            _fail(f'--model: {error}')
    lock = None
    try:
        job = prepare(options)
        if not options.server:  # a folder of another job is refused before the model loads
            check_rerun(Path(options.output), job.manifest(options.model, None))
        lock = FolderLock(Path(options.output))
        job.writer.prepare()
        if options.engine == 'ray':
            from clipserve.jobs.ray_engine import run_ray

            summary = run_ray(job)
        else:
            summary = _run_here(job)
    except (InputError, OutputError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        print(
            '\nclipserve embed: interrupted; the complete shards are kept: rerun the same command to continue',
            file=sys.stderr,
        )
        raise SystemExit(130)
    finally:
        if lock is not None:
            lock.release()
    _report(summary, args.json)
    if args.index:
        summary['index'] = _load_index(args, summary)
    return summary


def _load_index(args, summary: dict) -> dict:
    """`--index`: the folder just written, loaded into the search index it names (index_load.py)."""
    from clipserve.errors import ClipServeError
    from clipserve.jobs.index_load import LoadError, run

    url = args.index if args.index.startswith(('http://', 'https://')) else None
    vectors = args.index_vectors or ('image' if summary.get('images', 0) or args.modality != 'text' else 'text')
    load = argparse.Namespace(
        folder=args.output,
        into=None if url else args.index,
        qdrant_url=url,
        collection='clipserve',
        qdrant_api_key=None,
        vectors=vectors,
        metric='cosine',
        quantization='none',
        quiet=args.quiet,
    )
    try:
        loaded = run(load)
    except (LoadError, ClipServeError, OSError) as error:
        _fail(f'the embeddings are written, but loading them into {args.index} failed: {error}')
    print(f'clipserve embed: {loaded["count"]:,} documents in the index {loaded["index"]}', file=sys.stderr)
    return loaded


def _run_here(job) -> dict:
    from clipserve.jobs.embedders import ModelEmbedder, ServerEmbedder
    from clipserve.jobs.local import run_local
    from clipserve.jobs.progress import Progress
    from clipserve.jobs.server_client import ServerError

    o = job.options
    started = time.perf_counter()
    try:
        if o.server:
            embedder = ServerEmbedder(
                o.server, o.model if o.model != JobOptions.model else None, o.token, o.resolved_batch()
            )
            name = embedder.description
        else:
            if not o.quiet:
                print(f'clipserve embed: loading {o.model} on {o.backend} ...', file=sys.stderr)
            embedder = ModelEmbedder(
                o.backend,
                o.model,
                o.device,
                o.dtype,
                o.model_path,
                o.resolved_batch(),
                o.max_image_pixels,
                o.resolved_threads(),
            )
            name = o.model
    except ServerError as e:
        _fail(str(e))
    load_seconds = time.perf_counter() - started
    try:
        check_manifest(Path(o.output), job.manifest(name, embedder.precision))
        pending = job.pending
        skipped = job.plan.rows - sum(p.count for p in pending)
        progress = Progress(sum(p.count for p in pending), skipped, len(pending), quiet=o.quiet)
        if not o.quiet:
            print(
                f'clipserve embed: {job.plan.description} -> {o.output}: {len(pending)} of {len(job.plan.parts)} '
                f'shards to do, with {embedder.description}',
                file=sys.stderr,
            )
        try:
            run_local(job, embedder, progress)
        except ServerError as e:
            progress.close()
            _fail(f'{e} (the shards already written are kept; rerun to continue)')
        progress.close()
        summary = progress.summary() | {'engine': 'local', 'output': o.output, 'model': embedder.description}
        return summary | {'load_seconds': round(load_seconds, 3)}
    finally:
        embedder.close()


def _report(summary: dict, as_json: bool) -> None:
    print(
        f'clipserve embed: {summary["embedded"]} rows embedded, {summary["errors"]} failed (errors/), '
        f'{summary["skipped_rows"]} done before; {summary["seconds"]:.1f} s'
        + (f' (+ {summary["load_seconds"]:.1f} s loading the model)' if 'load_seconds' in summary else '')
        + ', '
        f'{summary["images_per_second"]:.1f} images/s ({summary["engine"]})',
        file=sys.stderr,
    )
    if as_json:
        print(json.dumps(summary))
