"""ViT-B-16-SigLIP against ViT-B-16 (same ViT-B/16 image tower size), model only and served, per backend.

    .venv/bin/python -m benchmarks.families [--backends torch onnx] [--seconds 3] [--rounds 2]

Both at seeded random weights (the real ones cannot be downloaded here): ViT-B-16 as `ViT-B-16::random`,
SigLIP as a local-dir folder with open_clip's own ViT-B-16-SigLIP config and a SentencePiece tokenizer
trained on a few sentences (what the speed depends on is the towers' shapes and the 64-token fixed-length
text input, not the vocabulary). Texts are ~10-word captions in batches of 8 (ViT-B-16 trims its padding,
SigLIP always runs 64 positions); images are 224x224 batches of 8. Model-only: the backend's own calls;
served: one clip-client sending batches of 8 to a Flow with one CLIPEncoder. Each SigLIP rate is divided
by the mean of the ViT-B-16 rates measured just before and after it (bracketed, so drift cancels).
Prints a table, writes benchmarks/results/families.json and families.png.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.common import bracketed, machine, markdown_table, save, save_plot, sustained_rate
from devkit.model_folders import SIGLIP_PREPROCESS, local_dir, unigram_tokenizer

CAPTIONS = [
    'a photo of a small brown dog running on the beach at sunset',
    'two people riding bicycles along a busy city street in the rain',
    'a bowl of fresh fruit on a wooden kitchen table near a window',
    'an old red tractor parked in a green field under a cloudy sky',
] * 2
BASELINE = 'ViT-B-16::random'


def siglip_folder(root: Path) -> str:
    import open_clip

    folder = root / 'vit-b-16-siglip'
    folder.mkdir(parents=True)
    unigram_tokenizer(folder, vocab_size=600)
    local_dir(folder, open_clip.get_model_config('ViT-B-16-SigLIP'), SIGLIP_PREPROCESS)
    return f'local-dir:{folder}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--backends', nargs='+', default=['torch', 'onnx'])
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--rounds', type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')
    # this process runs torch before it starts Flows; forked executors can hang in libgomp
    os.environ.setdefault('JINA_MP_START_METHOD', 'spawn')

    from clip_client import Client
    from docarray import Document, DocumentArray
    from jina import Flow

    from clipserve import CLIPEncoder
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.backends.onnx.export import export_onnx
    from clipserve.models.preprocess import preprocess_bytes

    workdir = tempfile.TemporaryDirectory(prefix='clipserve-families-')
    root = Path(workdir.name)
    models = {'ViT-B-16': BASELINE, 'ViT-B-16-SigLIP': siglip_folder(root)}
    exports = {}
    if 'onnx' in args.backends:
        for label, name in models.items():
            exports[label] = root / f'{label}-onnx'
            export_onnx(name, exports[label])
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(buffer, format='JPEG')
    jpeg = buffer.getvalue()
    results, rows = [], []
    for backend_name in args.backends:
        options = BackendOptions(device='cpu')
        paths = {label: str(exports[label]) if backend_name == 'onnx' else None for label in models}
        backends = {
            label: create_backend(backend_name, name, options, model_path=paths[label])
            for label, name in models.items()
        }
        ports = {label: free_port() for label in models}
        flows = contextlib.ExitStack()
        for label, name in models.items():
            uses_with = {'name': name, 'backend': backend_name, 'model_path': paths[label]}
            flow = Flow(port=ports[label]).add(
                uses=CLIPEncoder, uses_with=uses_with, allow_concurrent=True, timeout_ready=-1
            )
            flows.enter_context(flow)
        try:
            clients = {label: Client(f'grpc://127.0.0.1:{port}') for label, port in ports.items()}

            def model_texts(label):
                b = backends[label]
                tokens = b.tokenizer(CAPTIONS)
                return lambda: sustained_rate(
                    lambda: b.encode_texts(tokens.input_ids, tokens.attention_mask), 8, args.seconds
                )

            def model_images(label):
                b = backends[label]
                pixels = np.stack([preprocess_bytes(jpeg, b.preprocess)] * 8)
                return lambda: sustained_rate(lambda: b.encode_images(pixels), 8, args.seconds)

            def served_texts(label):
                return lambda: sustained_rate(lambda: clients[label].encode(CAPTIONS, batch_size=8), 8, args.seconds)

            def served_images(label):
                docs = DocumentArray([Document(blob=jpeg) for _ in range(8)])
                return lambda: sustained_rate(
                    lambda: clients[label].encode(DocumentArray(docs, copy=True), batch_size=8), 8, args.seconds
                )

            for where, kind, make in (
                ('model only', 'texts', model_texts),
                ('model only', 'images', model_images),
                ('served', 'texts', served_texts),
                ('served', 'images', served_images),
            ):
                ratio, values = bracketed(make('ViT-B-16'), {'siglip': make('ViT-B-16-SigLIP')}, args.rounds)
                cell = {
                    'backend': backend_name,
                    'where': where,
                    'kind': kind,
                    'vit_b_16_per_s': values['baseline'],
                    'siglip_per_s': values['siglip'],
                    'siglip_over_vit_b_16': ratio['siglip'],
                }
                results.append(cell)
                rows.append(
                    [
                        backend_name,
                        where,
                        kind,
                        f'{values["baseline"]:.1f}',
                        f'{values["siglip"]:.1f}',
                        f'{ratio["siglip"]:.2f}',
                    ]
                )
                print(json.dumps(cell))
        finally:
            flows.close()
            for b in backends.values():
                b.close()
    info = machine()
    print(
        f'\nseeded random weights, {info["cpu"]}, {info["cores"]} cores, load {info["load_avg"]:.2f}, {info["when"]}\n'
    )
    headers = ['backend', 'where', 'input', 'ViT-B-16 /s', 'ViT-B-16-SigLIP /s', 'SigLIP / ViT-B-16']
    print(markdown_table(headers, rows))
    path = save('families', {'machine': info, 'results': results})

    def draw(axes):
        for ax, kind in zip(axes, ('texts', 'images')):
            cells = [r for r in results if r['kind'] == kind]
            x = np.arange(len(cells))
            ax.bar(x - 0.2, [c['vit_b_16_per_s'] for c in cells], 0.4, label='ViT-B-16')
            ax.bar(x + 0.2, [c['siglip_per_s'] for c in cells], 0.4, label='ViT-B-16-SigLIP')
            ax.set_xticks(x, [f'{c["backend"]}\n{c["where"]}' for c in cells])
            ax.set_title(kind)
            ax.set_ylabel('items/s')
            ax.legend()

    save_plot(path, draw, ncols=2, figsize=(10, 3.8))
    print(f'\nwrote {path}')


if __name__ == '__main__':
    main()
