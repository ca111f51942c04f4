"""benchmarks/serving.py's precision table: each other precision of a backend (torch auto, onnx int8) against
fp32 of the same backend, model-only and served, every ratio bracketed by fp32 windows, with the cosine of
its embeddings to fp32's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import bracketed, sustained_rate
from benchmarks.serving_workloads import SHORT, free_port, jpeg_640x480, served


def precision_rows(pair: str, args, workloads: dict, checkpoint: str | None, onnx_dir: str) -> list[dict]:
    """`backend:dtype` against `backend:fp32`: model-only and served rates, each bracketed by fp32 windows."""
    from docarray import Document, DocumentArray
    from jina import Client, Flow

    from clipserve import CLIPEncoder
    from clipserve.backends import BackendOptions, create_backend
    from clipserve.models.preprocess import preprocess_bytes
    from clipserve.models.tokenizer import Tokenizer

    backend_name, _, dtype = pair.partition(':')
    batch, tokenizer, jpeg = 8, Tokenizer(), jpeg_640x480()
    model = args.model if backend_name == 'onnx' else checkpoint
    path = onnx_dir if backend_name == 'onnx' else None
    if backend_name == 'onnx' and not Path(onnx_dir, 'clipserve.json').exists():
        from clipserve.backends.onnx.export import export_onnx

        export_onnx(args.model, onnx_dir)
    local = {
        d: create_backend(backend_name, model, BackendOptions(device='cpu', dtype=d), model_path=path)
        for d in ('fp32', dtype)
    }
    pixels = np.stack([preprocess_bytes(jpeg, local['fp32'].preprocess) for _ in range(batch)])
    tokens = tokenizer([SHORT] * batch)

    def model_only(backend, what):
        if what == 'images 640x480':  # decoding and preprocessing included, as the server does them
            return lambda: backend.encode_images(
                np.stack([preprocess_bytes(jpeg, backend.preprocess) for _ in range(batch)])
            )
        return lambda: backend.encode_texts(tokens.input_ids, tokens.attention_mask)

    def cosine(what):
        def run(b):
            return model_only(b, what)() if what != 'images 640x480' else b.encode_images(pixels)

        a, b = run(local['fp32']).astype(np.float64), run(local[dtype]).astype(np.float64)
        return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())

    ports = {d: free_port() for d in local}
    flows = {
        d: Flow(port=ports[d]).add(
            uses=CLIPEncoder,
            uses_with={'name': model, 'backend': backend_name, 'dtype': d, 'minibatch_size': 32}
            | ({'model_path': onnx_dir} if path else {}),
            allow_concurrent=True,
            timeout_ready=-1,
        )
        for d in local
    }
    rows = []
    with flows['fp32'], flows[dtype]:
        served_precision = Client(host='127.0.0.1', port=ports[dtype]).post(
            '/clipserve/info', DocumentArray([Document()]), return_responses=True
        )
        name = next(iter(served_precision[0].parameters['__results__'].values()))['dtype']
        for what in ('short texts', 'images 640x480'):
            docs_fn = workloads[what][0]
            seconds, rounds = args.seconds, args.rounds
            alone, alone_rates = bracketed(
                lambda: sustained_rate(model_only(local['fp32'], what), batch, seconds),
                {dtype: lambda: sustained_rate(model_only(local[dtype], what), batch, seconds)},
                rounds,
            )
            flow = {}
            for clients in (1, 4):
                flow[clients] = bracketed(
                    lambda: served(ports['fp32'], docs_fn, clients, batch, seconds),
                    {dtype: lambda: served(ports[dtype], docs_fn, clients, batch, seconds)},
                    rounds,
                )
            rows.append(
                {
                    'backend': backend_name,
                    'precision': name,
                    'workload': what,
                    'model_only': alone_rates[dtype],
                    'model_only_fp32': alone_rates['baseline'],
                    'model_only_vs_fp32': alone[dtype],
                    'flow_1_client': flow[1][1][dtype],
                    'flow_1_vs_fp32': flow[1][0][dtype],
                    'flow_4_clients': flow[4][1][dtype],
                    'flow_4_vs_fp32': flow[4][0][dtype],
                    'min_cosine': cosine(what),
                }
            )
    return rows
