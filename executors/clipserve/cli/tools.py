"""`clipserve export onnx|reranker` (a model to files another runtime serves) and `clipserve ready` (the
container's HEALTHCHECK: exit 0 only when every executor copy of the Flow is ready)."""

from __future__ import annotations

import argparse
from pathlib import Path

from clipserve.cli.errors import UsageError


def add_parsers(commands) -> None:
    export = commands.add_parser('export', help='export a model to ONNX', description='Export a model to files.')
    kinds = export.add_subparsers(dest='kind', metavar='KIND', required=True)
    onnx = kinds.add_parser(
        'onnx',
        help='a CLIP model: visual.onnx, textual.onnx, clipserve.json',
        description='Export a model to ONNX (visual.onnx, textual.onnx, clipserve.json), checked against PyTorch.',
    )
    onnx.add_argument('name', help='model name, e.g. ViT-B-32::openai')
    onnx.add_argument('out_dir', help='directory to write (serve it with --backend onnx --model-path DIR)')
    onnx.add_argument('--opset', type=int, default=18, help='ONNX opset of the export (default %(default)s)')
    onnx.add_argument(
        '--inline',
        action='store_true',
        help='one self-contained .onnx file per tower (default: weights in .onnx.data files, which load with less '
        'memory)',
    )
    onnx.add_argument('--external-data', action='store_true', help=argparse.SUPPRESS)  # the default now
    onnx.add_argument('--cache', action='store_true', help=argparse.SUPPRESS)  # atomic write, used by the server
    onnx.add_argument(
        '--trust-remote-code',
        action='store_true',
        help='a transformers checkpoint with its own model code: run that code (read it first)',
    )
    onnx.add_argument('--truncate-dim', type=int, help='a Matryoshka-trained checkpoint: keep the first N dimensions')
    onnx.set_defaults(run=export_onnx)
    reranker = kinds.add_parser(
        'reranker',
        help='a cross-encoder: reranker.onnx and its tokenizer files',
        description='Export a cross-encoder reranker to ONNX (reranker.onnx + its tokenizer files), checked against '
        'PyTorch.',
    )
    reranker.add_argument('name', help='the checkpoint: a hub id or a folder (a *ForSequenceClassification model)')
    reranker.add_argument('out_dir', help='directory to write (serve it with backend onnx and model_path)')
    reranker.add_argument('--opset', type=int, default=18, help='ONNX opset of the export (default %(default)s)')
    reranker.set_defaults(run=export_reranker)

    ready = commands.add_parser(
        'ready',
        help="exit 0 when a Flow is ready (a container's HEALTHCHECK)",
        description='Exit 0 when every executor copy of the Flow behind a gRPC gateway is ready, else 1.',
    )
    ready.add_argument('address', nargs='?', default='127.0.0.1:51000', help='the gRPC gateway (default %(default)s)')
    ready.add_argument('--timeout', type=float, default=5.0, help='seconds (default %(default)s)')
    ready.add_argument('--tls', action='store_true', help='the gateway serves TLS (flows/tls.yml)')
    ready.set_defaults(run=run_ready)


def export_onnx(args) -> int:
    from clipserve.errors import UnknownModelError
    from clipserve.models.known_models import check_model_name

    try:
        check_model_name(args.name)
    except UnknownModelError as error:
        raise UsageError(str(error)) from None
    from clipserve.backends.onnx.export import export_onnx as export
    from clipserve.backends.onnx.export import export_to_cache

    load = {'trust_remote_code': args.trust_remote_code, 'truncate_dim': args.truncate_dim}
    if args.cache:
        export_to_cache(args.name, Path(args.out_dir), opset=args.opset, **load)
        return 0
    metadata = export(args.name, args.out_dir, opset=args.opset, external_data=not args.inline, **load)
    for tower, diff in metadata.max_abs_diff.items():
        print(f'{tower}.onnx: max |onnxruntime - torch| = {diff:.2e}')
    print(f'wrote {args.out_dir}: {metadata.model}, {metadata.embed_dim}-d, opset {metadata.opset}')
    return 0


def export_reranker(args) -> int:
    from clipserve.backends.onnx.cross_encoder import export_cross_encoder
    from clipserve.errors import ClipServeError
    from clipserve.models.cross_encoder import resolve_cross_encoder

    try:
        diff = export_cross_encoder(resolve_cross_encoder(args.name), Path(args.out_dir), args.opset)
    except ClipServeError as error:
        raise UsageError(str(error)) from None
    print(f'wrote {args.out_dir}: max |onnxruntime - torch| = {diff:.2e}')
    return 0


def run_ready(args) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from clipserve.serving.gateway.readiness import READINESS_SERVICE

    target = args.address.split('://', 1)[-1]
    tls = args.tls or args.address.startswith('grpcs://')
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials()) if tls else grpc.insecure_channel(target)
    try:
        with channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=args.timeout
            )
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    except grpc.RpcError as error:
        status = error.code().name
    print(f'{args.address}: {"ready" if status == "SERVING" else "not ready"} ({status})')
    return 0 if status == 'SERVING' else 1
