"""Command line: `python -m clipserve [flow.yml]` serves a Flow; `... models` lists models;
`... export onnx NAME OUT_DIR` exports a model to ONNX (`export reranker` a cross-encoder); `... ready
[HOST:PORT]` exits 0 only when the Flow behind that gRPC gateway is ready (the container's HEALTHCHECK);
`... embed INPUT --output DIR` embeds a whole collection (clipserve.jobs); `... index DIR --into PATH` loads it
into a search index.

Like clip-as-service's `python -m clip_server`, a bare file name is also looked up in the
repository's `flows/` folder, and `-i` reads the Flow YAML from standard input.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

DEFAULT_FLOW = 'torch.yml'
SOURCE_FLOWS = Path(__file__).resolve().parents[2] / 'flows'  # a checkout (editable install)
INSTALLED_FLOWS = Path('share') / 'clipserve' / 'flows'  # under sys.prefix: a wheel's data files


def flow_dirs() -> list[Path]:
    return [SOURCE_FLOWS, Path(sys.prefix) / INSTALLED_FLOWS, Path('flows')]


def find_flow(arg: str) -> Path:
    for candidate in (Path(arg), *(folder / arg for folder in flow_dirs())):
        if candidate.is_file():
            return candidate
    looked = ', '.join(str(d) for d in flow_dirs())
    raise SystemExit(f'clipserve: no Flow file {arg!r} (looked in the current directory, {looked})')


def serve(flow_arg: str | None, from_stdin: bool) -> None:
    import clipserve.serving.gateway  # noqa: F401  (defines clipserve's gateways for the YAML)
    from clipserve.serving.jina_compat import serve_flow

    if from_stdin:
        with tempfile.NamedTemporaryFile('w', suffix='.yml', delete=False) as f:
            f.write(sys.stdin.read())
        path = Path(f.name)
    else:
        path = find_flow(flow_arg or DEFAULT_FLOW)
    serve_flow(str(path))


def _cell(value) -> str:
    return '-' if value is None else str(value)


def list_models(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m clipserve models',
        description='Every open_clip model and pretrained tag, with its facts (tokenizer, context, sizes, backends).',
    )
    parser.add_argument('--json', action='store_true', help='one JSON list instead of a table')
    parser.add_argument('--family', help='only this family (e.g. SigLIP, "MetaCLIP 2"), case-insensitive')
    args = parser.parse_args(argv)
    import json

    from clipserve.models.catalogue import as_dicts, catalogue
    from clipserve.models.names import LEGACY_ALIASES

    rows = [r for r in catalogue() if not args.family or r.family.lower() == args.family.lower()]
    if args.json:
        print(json.dumps(as_dicts(rows), indent=1))
        return
    header = ('name', 'family', 'tokenizer', 'context', 'dim', 'image', 'resize', 'backends')
    table = [header] + [
        (
            r.name,
            r.family,
            r.tokenizer,
            _cell(r.context_length),
            _cell(r.embed_dim),
            _cell(r.image_size),
            r.resize_mode,
            r.backends,
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print('  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(
        f'\n{len(rows)} models; any open_clip architecture also takes ::random (seeded random weights), a '
        'checkpoint file (arch::/path/weights.safetensors) or a folder (local-dir:/path); M-CLIP names a folder '
        "of its repository's files (M-CLIP/<model>::/path), CN-CLIP a checkpoint (CN-CLIP/<model>::/path/x.pt) "
        'or ::random; transformers checkpoints of the listed types: transformers:<hub id> or transformers:/folder'
    )
    print('legacy aliases: ' + ', '.join(f'{k} -> {v}' for k, v in LEGACY_ALIASES.items()))


def export(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m clipserve export onnx',
        description='Export a model to ONNX (visual.onnx, textual.onnx, clipserve.json).',
    )
    parser.add_argument('name', help='model name, e.g. ViT-B-32::openai')
    parser.add_argument('out_dir', help='directory to write')
    parser.add_argument('--opset', type=int, default=18, help='ONNX opset of the export (default 18)')
    parser.add_argument(
        '--inline',
        action='store_true',
        help='one self-contained .onnx file per tower (default: weights in .onnx.data files, '
        'which load with less memory)',
    )
    parser.add_argument('--external-data', action='store_true', help=argparse.SUPPRESS)  # the default now
    parser.add_argument('--cache', action='store_true', help=argparse.SUPPRESS)  # atomic write, used by the server
    parser.add_argument(
        '--trust-remote-code',
        action='store_true',
        help='a transformers checkpoint with its own model code: run that code (read it first)',
    )
    parser.add_argument('--truncate-dim', type=int, help='a Matryoshka-trained checkpoint: keep the first N dimensions')
    args = parser.parse_args(argv)
    from clipserve.backends.onnx.export import export_onnx, export_to_cache

    load = {'trust_remote_code': args.trust_remote_code, 'truncate_dim': args.truncate_dim}
    if args.cache:
        export_to_cache(args.name, Path(args.out_dir), opset=args.opset, **load)
        return
    metadata = export_onnx(args.name, args.out_dir, opset=args.opset, external_data=not args.inline, **load)
    for tower, diff in metadata.max_abs_diff.items():
        print(f'{tower}.onnx: max |onnxruntime - torch| = {diff:.2e}')
    print(f'wrote {args.out_dir}: {metadata.model}, {metadata.embed_dim}-d, opset {metadata.opset}')


def export_reranker(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m clipserve export reranker',
        description='Export a cross-encoder reranker to ONNX (reranker.onnx + its tokenizer files), checked against PyTorch.',
    )
    parser.add_argument('name', help='the checkpoint: a hub id or a folder (a *ForSequenceClassification model)')
    parser.add_argument('out_dir', help='directory to write (serve it with backend onnx and model_path)')
    parser.add_argument('--opset', type=int, default=18, help='ONNX opset of the export (default 18)')
    args = parser.parse_args(argv)
    from clipserve.backends.onnx.cross_encoder import export_cross_encoder
    from clipserve.errors import ClipServeError
    from clipserve.models.cross_encoder import resolve_cross_encoder

    try:
        diff = export_cross_encoder(resolve_cross_encoder(args.name), Path(args.out_dir), args.opset)
    except ClipServeError as error:
        raise SystemExit(f'clipserve export reranker: {error}') from None
    print(f'wrote {args.out_dir}: max |onnxruntime - torch| = {diff:.2e}')


def ready(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog='python -m clipserve ready', description='Exit 0 when every executor copy of the Flow is ready, else 1.'
    )
    parser.add_argument('address', nargs='?', default='127.0.0.1:51000', help='the gRPC gateway (default %(default)s)')
    parser.add_argument('--timeout', type=float, default=5.0, help='seconds (default %(default)s)')
    parser.add_argument('--tls', action='store_true', help='the gateway serves TLS (flows/tls.yml)')
    args = parser.parse_args(argv)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from clipserve.serving.readiness import READINESS_SERVICE

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
    raise SystemExit(0 if status == 'SERVING' else 1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ['models']:
        return list_models(argv[1:])
    if argv[:2] == ['export', 'onnx']:
        return export(argv[2:])
    if argv[:2] == ['export', 'reranker']:
        return export_reranker(argv[2:])
    if argv[:1] == ['ready']:
        return ready(argv[1:])
    if argv[:1] == ['embed']:
        from clipserve.jobs.cli import main as embed

        embed(argv[1:])
        return
    if argv[:1] == ['index']:
        from clipserve.jobs.index_load import main as index

        index(argv[1:])
        return
    parser = argparse.ArgumentParser(prog='python -m clipserve', description='Serve a clipserve Flow.')
    parser.add_argument('flow', nargs='?', help=f'Flow YAML path or a name in flows/ (default {DEFAULT_FLOW})')
    parser.add_argument('-i', action='store_true', help='read the Flow YAML from standard input')
    args = parser.parse_args(argv)
    serve(args.flow, args.i)


if __name__ == '__main__':
    main()
