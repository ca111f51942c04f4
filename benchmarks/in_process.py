"""clipserve in process (`from clipserve import Model`) and served, against FastEmbed in process, on one ONNX export.

    .venv/bin/python -m benchmarks.in_process [--model ViT-B-32::random] [--export DIR] [--seconds 4] [--rounds 3]
                                              [--no-served]

Texts: FastEmbed's TextEmbedding (fastembed_text.py in a process of its own, `embed` of 256 copies of one
caption a call, pooling and normalisation off since the graph pools) is the baseline; each clipserve
configuration is measured between two FastEmbed windows (common.bracketed), so its ratio holds on a busy
machine. In process: Model(backend='onnx') on the very export FastEmbed runs, and Model(backend='torch') at
its default precision, 256 captions a call, each with its default forward pass (Model's batch_size), and the
torch Model again at 32 captions a forward pass (the passes the served torch Flow merges here). Served
(served_rates.py, unless --no-served): `clipserve serve` on the same export (onnx; 1 and 4 clients) and on
the default torch backend at its default precision (4 clients), clients of 8 short captions a request, over
gRPC (Jina's client, /encode) and over HTTP (/v1/embeddings); each also as a fraction of its backend's model
in process. Images (generated 320x240 JPEG files, read and decoded by each tool): FastEmbed's
ImageEmbedding on the same export's visual graph (fastembed_images.py, its default batch of 16) is the
baseline for Model(backend='onnx') and Model(backend='torch'), 64 paths a call, and for the served Flows:
gRPC clients (as for texts) sending 8 of those files a request as document blobs (as clip-client sends local
files). For each served row, the replica's own count of its forward passes in the window (/clipserve/info):
the rows merged into a pass and the share of the window the model was running. Needs the `bench` extra
(fastembed). Prints a table, writes benchmarks/results/in_process.json and in_process.png.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks import plots
from benchmarks.common import bracketed, machine, markdown_table, save, sustained_rate
from benchmarks.served_rates import PROTOCOLS, Served, images_rate, texts_rate
from benchmarks.text_rates import FASTEMBED_BATCH, FastEmbedImagesProcess, FastEmbedProcess

CAPTION = 'a photo of a small brown dog running on the beach'
IMAGES = 64  # per call
SERVED_TEXTS = 8  # per request
SERVED_IMAGES = 8  # per request (gRPC)
SERVED_PASS = 32  # texts a forward pass, in process, beside the served rows: what 4 clients' requests make
CLIENTS = (1, 4)


def jpegs(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        y, x = np.mgrid[0:240, 0:320]
        base = np.stack([x * 255 / 319, y * 255 / 239, (x + y) % 256], axis=-1) + rng.normal(0, 25, (240, 320, 3))
        buffer = io.BytesIO()
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buffer, format='JPEG', quality=90)
        out.append(buffer.getvalue())
    return out


def write_jpegs(folder: Path, n: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, data in enumerate(jpegs(n)):
        (folder / f'{i:03d}.jpg').write_bytes(data)
        paths.append(str(folder / f'{i:03d}.jpg'))
    return paths


def served_name(backend: str, protocol: str, clients: int) -> str:
    route = 'gRPC /encode' if protocol == 'grpc' else 'HTTP /v1'
    return f'served {backend}, {route}, {clients} client{"s" * (clients > 1)}'


def of_model_in_process(ratios: dict, backend_of: dict) -> dict:
    """Each served rate as a fraction of its backend's model in process (both ratios to the same FastEmbed);
    `backend_of`: each measure's name -> its backend."""
    in_process = {backend_of[name]: ratios[name] for name in ratios if not name.startswith('served')}
    return {name: ratios[name] / in_process[backend_of[name]] for name in ratios if name.startswith('served')}


def served_runs(served: dict, protocols: tuple) -> list[tuple]:
    """(backend, Served, protocol, clients) of each served row: the onnx Flow with 1 and 4 clients, the
    default (torch) Flow with 4."""
    return [
        (backend, flow, protocol, clients)
        for backend, flow in served.items()
        for protocol in protocols
        for clients in (CLIENTS if backend == 'onnx' else CLIENTS[-1:])
    ]


def measure_texts(args, export: str, models: dict, served: dict, small_passes: dict) -> dict:
    """`small_passes`: models at the served Flows' merged pass (not the reference for served rows)."""
    texts = [CAPTION] * FASTEMBED_BATCH
    measures = {
        name: (lambda m=model: sustained_rate(lambda: m.embed_texts(texts), len(texts), args.seconds))
        for name, model in {**models, **small_passes}.items()
    }
    backend_of = {name: model.backend.name for name, model in models.items()}
    backend_of.update(
        {name: f'{model.backend.name}@{model.pipeline.minibatch_size}' for name, model in small_passes.items()}
    )
    request = [CAPTION] * SERVED_TEXTS
    windows = {}  # a served row's forward passes, window by window
    for backend, flow, protocol, clients in served_runs(served, PROTOCOLS):
        name = served_name(backend, protocol, clients)
        windows[name] = []
        measures[name] = lambda f=flow, p=protocol, c=clients, w=windows[name]: texts_rate(
            f, p, c, request, args.seconds, passes=w
        )
        backend_of[name] = backend
    return against_fastembed(FastEmbedProcess(export, CAPTION), args, measures, backend_of, windows, 'texts')


def against_fastembed(fastembed, args, measures: dict, backend_of: dict, windows: dict, kind: str) -> dict:
    """Every measure between two windows of `fastembed` (its process, not yet started), as the results of `kind`."""
    with fastembed:
        ratios, rates = bracketed(lambda: fastembed.rate(args.seconds), measures, args.rounds)
        check = fastembed.check
    return {
        'rates': rates,
        'vs_fastembed': ratios,
        'vs_model_in_process': of_model_in_process(ratios, backend_of),
        'served_passes': {name: median_passes(found, kind) for name, found in windows.items()},
        'fastembed_check': check,
    }


def median_passes(windows: list[dict], kind: str) -> dict:
    """A served row's rows merged per forward pass and the model's busy share of the window, medians over its
    windows (the replica's own count: /clipserve/info)."""
    found = [w[kind] for w in windows if kind in w]
    return {key: statistics.median(w[key] for w in found) for key in ('rows_per_pass', 'busy')} if found else {}


def measure_images(args, export: str, models: dict, image_dir: Path, served: dict) -> dict:
    paths = write_jpegs(image_dir, IMAGES)
    measures = {
        name: (lambda m=model: sustained_rate(lambda: m.embed_images(paths), len(paths), args.seconds))
        for name, model in models.items()
    }
    backend_of = {name: model.backend.name for name, model in models.items()}
    request = [Path(p).read_bytes() for p in paths[:SERVED_IMAGES]]
    windows = {}
    for backend, flow, protocol, clients in served_runs(served, ('grpc',)):
        name = served_name(backend, protocol, clients)
        windows[name] = []
        measures[name] = lambda f=flow, c=clients, w=windows[name]: images_rate(f, c, request, args.seconds, passes=w)
        backend_of[name] = backend
    fastembed = FastEmbedImagesProcess(export, str(image_dir))
    return against_fastembed(fastembed, args, measures, backend_of, windows, 'images')


def table(results: dict) -> str:
    texts, images = results['texts'], results['images']
    rows = [['FastEmbed (onnx, in process)', f'{texts["rates"]["baseline"]:.1f}', '1.00x', '-']]
    rows[-1] += [f'{images["rates"]["baseline"]:.1f}', '1.00x', '-', '-', '-']
    for name, ratio in texts['vs_fastembed'].items():
        of_model = texts['vs_model_in_process'].get(name)
        rows.append(
            [name, f'{texts["rates"][name]:.1f}', f'{ratio:.2f}x', '-' if of_model is None else f'{of_model:.2f}']
        )
        image_ratio = images['vs_fastembed'].get(name)
        rows[-1] += ['-', '-'] if image_ratio is None else [f'{images["rates"][name]:.1f}', f'{image_ratio:.2f}x']
        of_model = images['vs_model_in_process'].get(name)
        rows[-1].append('-' if of_model is None else f'{of_model:.2f}')
        rows[-1] += [passes_cell(texts, name), passes_cell(images, name)]
    headers = ['', 'texts/s', 'vs FastEmbed', 'of its model in process', 'images/s', 'vs FastEmbed', 'of its model']
    headers += ['served texts: rows a pass, model busy', 'served images: rows a pass, model busy']
    return markdown_table(headers, rows)


def passes_cell(results: dict, name: str) -> str:
    found = results.get('served_passes', {}).get(name)
    return f'{found["rows_per_pass"]:.1f}, {found["busy"]:.0%}' if found else '-'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='ViT-B-32::random')
    parser.add_argument('--export', help='an export of --model (python -m clipserve export onnx); default: made now')
    parser.add_argument('--seconds', type=float, default=4.0)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--no-served', action='store_true', help='skip the served rows')
    args = parser.parse_args()

    from clipserve import Model

    with tempfile.TemporaryDirectory() as scratch:
        export = args.export
        if not export:
            from clipserve.backends.onnx.export import export_onnx

            export = f'{scratch}/export'
            export_onnx(args.model, export)
        # each at its defaults, as a user gets it (the forward pass's rows: Model's batch_size)
        onnx = Model(args.model, backend='onnx', model_path=str(export))
        torch = Model(args.model, backend='torch')
        models = {'clipserve onnx': onnx, f'clipserve torch ({torch.precision})': torch}
        # the torch Flow's clients (4 x 8 captions) give its passes at most 32 rows (served_passes)
        small = Model(args.model, backend='torch', batch_size=SERVED_PASS)
        small_passes = {f'clipserve torch ({small.precision}), {SERVED_PASS} a pass': small}
        with contextlib.ExitStack() as flows:
            served = {}
            if not args.no_served:  # both Flows up at once: an idle one takes no CPU
                served['onnx'] = flows.enter_context(Served(args.model, 'onnx', str(export)))
                served['torch'] = flows.enter_context(Served(args.model, 'torch'))
            texts = measure_texts(args, export, models, served, small_passes)
            images = measure_images(args, export, models, Path(scratch) / 'jpegs', served)
        for model in (onnx, torch, small):
            model.close()

    results = {
        'model': args.model,
        'machine': machine(),
        'seconds': args.seconds,
        'rounds': args.rounds,
        'texts_per_call': FASTEMBED_BATCH,
        'texts_per_request_served': SERVED_TEXTS,
        'images_per_call': IMAGES,
        'texts': texts,
        'images': images,
    }
    print(table(results))
    print(
        f'FastEmbed against clipserve on the export: texts {texts["fastembed_check"]}, images {images["fastembed_check"]}'
    )
    path = save('in_process', results)
    plots.in_process(results, path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
