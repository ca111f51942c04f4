"""`clipserve serve`: a model served from flags (the Flow is built here: an encoder, optionally an index and a
reranker, behind a gateway on gRPC and HTTP), or a Flow YAML served as written (`clipserve serve flows/x.yml`,
clip-as-service's `python -m clip_server x.yml`; a bare file name is also looked up in the shipped `flows/`, and
`-i` reads the YAML from standard input).

Everything a user can get wrong (a model name, a port, a missing folder) is checked here, before Jina starts or
a model loads, and reported in one line (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from clipserve.cli.errors import UsageError
from clipserve.config.parameters import TOKEN_ENV
from clipserve.models.runtimes import BACKENDS

SOURCE_FLOWS = Path(__file__).resolve().parents[3] / 'flows'  # a checkout (editable install)
INSTALLED_FLOWS = Path('share') / 'clipserve' / 'flows'  # under sys.prefix: a wheel's data files
DTYPES = ('auto', 'fp32', 'fp16', 'bf16', 'int8')
PROTOCOLS = ('grpc', 'http', 'websocket')
LOOPBACK = ('127.0.0.1', 'localhost', '::1')
# the flags that build a Flow: with a YAML they would be ignored, so they are refused instead
BUILD_FLAGS = (
    *('model', 'backend', 'dtype', 'device', 'model_path', 'replicas', 'index', 'reranker'),
    *('protocols', 'port', 'grpc_port', 'websocket_port', 'host'),
)
DEFAULT_PORTS = {'grpc': 51000, 'http': 51001, 'websocket': 51002}  # the shipped Flows' ports


def add_parser(commands) -> None:
    p = commands.add_parser(
        'serve',
        help='serve a model (flags) or a Flow YAML',
        description='Serve a model on gRPC and HTTP (/v1/embeddings, /v1/rank, /playground, ...): the flags\n'
        'build the Flow; or a Flow YAML, served as written.',
        epilog='examples:\n'
        '  clipserve serve --model ViT-B-32::random --port 8080      # seeded random weights: works offline\n'
        '  clipserve serve --model ViT-B-32::openai --backend onnx --token s3cret\n'
        '  clipserve serve --model ViT-B-32::openai --index ./my-index --reranker BAAI/bge-reranker-v2-m3\n'
        '  clipserve serve flows/search.yml                           # a Flow YAML (or: search.yml)',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument('flow', nargs='?', help='a Flow YAML (a path, or a name in the shipped flows/) to serve as written')
    p.add_argument('-i', dest='stdin', action='store_true', help='read the Flow YAML from standard input')
    m = p.add_argument_group('the model (without a YAML)')
    m.add_argument('--model', help='arch::pretrained (default ViT-B-32::openai; `clipserve models` lists them)')
    m.add_argument('--backend', choices=BACKENDS, help='the runtime (default torch)')
    m.add_argument(
        '--dtype', choices=DTYPES, help='precision (default auto: the fastest this CPU/GPU computes natively)'
    )
    m.add_argument('--device', help='cpu, cuda, cuda:1 (default: cuda when present)')
    m.add_argument('--model-path', help='onnx, openvino, tensorrt: an export folder (`clipserve export onnx`)')
    m.add_argument('--replicas', type=int, help='copies of the model, each with its own batching (default 1)')
    m.add_argument('--index', metavar='PATH', help='also index and search: the embedded index folder (created)')
    m.add_argument('--reranker', metavar='NAME', help='also rerank: a cross-encoder hub id or folder')
    g = p.add_argument_group('the gateway')
    g.add_argument('--port', type=int, help=f'HTTP port (default {DEFAULT_PORTS["http"]})')
    g.add_argument('--grpc-port', type=int, help=f'gRPC port (default {DEFAULT_PORTS["grpc"]})')
    g.add_argument('--websocket-port', type=int, help=f'WebSocket port (default {DEFAULT_PORTS["websocket"]})')
    g.add_argument('--protocols', help='comma separated, of grpc, http, websocket (default grpc,http)')
    g.add_argument('--host', help='the address the gateway listens on (default 0.0.0.0: every address)')
    g.add_argument('--token', help=f'require this token of every request (default: {TOKEN_ENV}, else none)')
    p.add_argument('--print-flow', action='store_true', help='print the Flow YAML the flags build, and exit')
    p.set_defaults(run=run)


def flow_dirs() -> list[Path]:
    return [SOURCE_FLOWS, Path(sys.prefix) / INSTALLED_FLOWS, Path('flows')]


def find_flow(arg: str) -> Path:
    for candidate in (Path(arg), *(folder / arg for folder in flow_dirs())):
        if candidate.is_file():
            return candidate
    looked = ', '.join(str(d) for d in flow_dirs())
    raise UsageError(f'no Flow file {arg!r} (looked in the current directory, {looked})')


def run(args) -> int:
    if args.flow or args.stdin:
        given = [f'--{name.replace("_", "-")}' for name in BUILD_FLAGS if getattr(args, name) is not None]
        if given:
            raise UsageError(
                f'{", ".join(given)}: these flags build a Flow; with a Flow YAML set them in the YAML (or its CLIPSERVE_* '
                'environment variables), or leave the YAML out'
            )
        return serve_yaml(read_stdin() if args.stdin else find_flow(args.flow), args)
    config = flow_config(args)
    import yaml

    text = yaml.safe_dump(config, sort_keys=False)
    if args.print_flow:
        print(text, end='')
        return 0
    check_ports_free(config['gateway']['host'], config['gateway']['port'])
    with tempfile.TemporaryDirectory(prefix='clipserve-flow-') as folder:
        path = Path(folder) / 'flow.yml'
        path.write_text(text, encoding='utf-8')
        return serve_yaml(path, args)


def read_stdin() -> Path:
    with tempfile.NamedTemporaryFile('w', suffix='.yml', delete=False) as f:
        f.write(sys.stdin.read())
    return Path(f.name)


def serve_yaml(path: Path, args) -> int:
    if args.print_flow:
        print(path.read_text(encoding='utf-8'), end='')
        return 0
    from clipserve.serving.jina.compat import serve_flow, shadowed_py_modules

    for name, found in shadowed_py_modules(path.read_text(encoding='utf-8')):
        dotted = 'clipserve.serving' if name == 'clipserve' else f'{name}.<a module of it>'
        raise UsageError(
            f'{path}: `py_modules: [{name}]` would import {found} (Jina looks the name up as a file on PATH '
            f'first): write `{dotted}` instead'
        )
    if args.token:
        os.environ[TOKEN_ENV] = args.token  # the gateway process reads it (serving/gateway/auth.py)
    quiet_third_party_warnings()
    import clipserve.serving.gateway.gateways  # noqa: F401  (defines clipserve's gateways for the YAML)

    serve_flow(str(path))
    return 0


# warnings other packages print at every start that say nothing about this server, each (message, category):
# jina-hubble-sdk imports pkg_resources (setuptools < 81 is pinned for it and for clip-client)
THIRD_PARTY_WARNINGS = (('pkg_resources is deprecated as an API', 'UserWarning'),)


def quiet_third_party_warnings() -> None:
    """Those warnings ignored here and, through PYTHONWARNINGS, in the Flow's processes (started fresh)."""
    import builtins
    import re
    import warnings

    for message, category in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings('ignore', message=re.escape(message), category=getattr(builtins, category))
    given = [os.environ.get('PYTHONWARNINGS', '')]
    os.environ['PYTHONWARNINGS'] = ','.join(
        [*filter(None, given), *(f'ignore:{message}:{category}' for message, category in THIRD_PARTY_WARNINGS)]
    )


def flow_config(args) -> dict:
    """The Flow the flags describe, checked; as a YAML's dict."""
    from clipserve.errors import UnknownModelError
    from clipserve.models.known_models import check_model_name

    protocols = [p.strip() for p in (args.protocols or 'grpc,http').split(',') if p.strip()]
    unknown = sorted(set(protocols) - set(PROTOCOLS))
    if not protocols or unknown or len(set(protocols)) != len(protocols):
        raise UsageError(f'--protocols {args.protocols!r}: give each of {", ".join(PROTOCOLS)} at most once')
    given = {'grpc': args.grpc_port, 'http': args.port, 'websocket': args.websocket_port}
    ports = {name: DEFAULT_PORTS[name] if port is None else port for name, port in given.items()}
    chosen = [ports[p] for p in protocols]
    if any(not 0 < port < 65536 for port in chosen) or len(set(chosen)) != len(chosen):
        raise UsageError(f'ports {chosen} for {", ".join(protocols)}: each from 1 to 65535, and different')
    if args.replicas is not None and args.replicas < 1:
        raise UsageError(f'--replicas {args.replicas}: at least 1')
    try:
        check_model_name(args.model)
    except UnknownModelError as error:
        raise UsageError(f'--model: {error}') from None
    for flag, folder in (('--model-path', args.model_path), ('--reranker', _local(args.reranker))):
        if folder and not Path(folder).expanduser().is_dir():
            raise UsageError(f'{flag} {folder!r}: no such folder')
    token = args.token or os.environ.get(TOKEN_ENV)
    gateway = {
        'uses': 'ClipServeGateway' if token else 'ReadyGateway',
        'py_modules': ['clipserve.serving.gateway.gateways'],
        'protocol': protocols,
        'port': chosen,
        'host': args.host or '0.0.0.0',
    }
    if token:
        gateway['uses_with'] = {'auth': 'required'}
    encoder = {
        key: value
        for key, value in (
            ('name', args.model),
            ('backend', args.backend),
            ('dtype', None if args.dtype == 'auto' else args.dtype),
            ('device', args.device),
            ('model_path', args.model_path),
        )
        if value is not None
    }
    executors = [_executor('encoder', 'CLIPEncoder', encoder, allow_concurrent=True, replicas=args.replicas or 1)]
    if args.index:
        executors.append(
            _executor('indexer', 'CLIPIndexer', {'index_path': str(Path(args.index).expanduser().resolve())})
        )
    if args.reranker:
        executors.append(_executor('reranker', 'CrossEncoderRanker', {'name': args.reranker}))
    return {'jtype': 'Flow', 'gateway': gateway, 'executors': executors}


def check_ports_free(host: str, ports: list[int]) -> None:
    """A port another process holds is said now, in one line (Jina would fail later, at length)."""
    import socket

    for port in ports:
        family = socket.AF_INET6 if ':' in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # as the servers themselves bind: a closed connection's TIME_WAIT does not hold the port, a listener does
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as error:
                raise UsageError(
                    f'port {port} on {host} is not free ({error.strerror}): is another server there?'
                ) from None


def _local(name: str | None) -> str | None:
    """A reranker named by a path (not a hub id): the folder that must exist."""
    return name if name and name.startswith(('/', './', '../', '~')) else None


def _executor(name: str, jtype: str, settings: dict, **extra) -> dict:
    return {
        'name': name,
        'host': '127.0.0.1',  # executors listen on loopback: only the gateway is reachable
        'uses': {'jtype': jtype, 'py_modules': ['clipserve.serving'], 'with': settings},
        'timeout_ready': 3_000_000,  # a big model's download and load can take minutes
        **extra,
    }
