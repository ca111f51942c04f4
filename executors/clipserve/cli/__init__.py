"""The command line: `clipserve COMMAND ...` (the console script) and `python -m clipserve COMMAND ...`.

    serve    a model from flags, or a Flow YAML as written
    models   the models, the default marked
    embed    a whole collection to files, resumably (clipserve.jobs)
    index    embed's output into a search index
    export   a model to ONNX (onnx), a cross-encoder to ONNX (reranker)
    ready    exit 0 when a Flow is ready

clip-as-service's form still works: `python -m clipserve flows/x.yml` (or a name in the shipped flows/, or `-i`
for the YAML on standard input) serves that Flow, and no arguments at all serve the default model.
"""

from __future__ import annotations

import argparse
import os
import sys

from clipserve.cli import models, serve, tools
from clipserve.cli.errors import UsageError

EXIT_CODES = (
    'exit status: 0 done; 1 the work failed (a Flow not ready, a job that could not finish); 2 a usage error or '
    'anything else you can fix (a model name, a flag, a missing file), said in one line before any model loads; '
    '130 interrupted (Ctrl-C).'
)
COMMANDS = ('serve', 'models', 'embed', 'index', 'export', 'ready')


def parser() -> argparse.ArgumentParser:
    from clipserve.config.version import __version__
    from clipserve.jobs import cli as embed_cli
    from clipserve.jobs import index_load

    p = argparse.ArgumentParser(
        prog='clipserve',
        description='Serve CLIP models (embeddings, ranking, search, rerank) and embed collections.',
        epilog=EXIT_CODES + ' `clipserve COMMAND --help` tells more.',
    )
    p.add_argument('--version', action='version', version=f'clipserve {__version__}')
    commands = p.add_subparsers(dest='command', metavar='COMMAND', title='commands')
    serve.add_parser(commands)
    models.add_parser(commands)
    embed = commands.add_parser(
        'embed',
        parents=[embed_cli.parser()],
        add_help=False,
        help='embed a collection into files, resumably',
        description=embed_cli.parser().description,
        epilog=EXIT_CODES,
    )
    embed.set_defaults(run=lambda args: _done(embed_cli.run(args)))
    index = commands.add_parser(
        'index',
        parents=[index_load.parser()],
        add_help=False,
        help="load embed's output into a search index",
        description=index_load.parser().description,
        epilog=EXIT_CODES,
    )
    index.set_defaults(run=lambda args: _done(index_load.load_command(args)))
    tools.add_parsers(commands)
    return p


def _done(_summary) -> int:
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, '-h', '--help', '--version'):
        argv = ['serve', *argv]  # clip-as-service's `python -m clip_server [flow.yml]`
    args = parser().parse_args(argv)
    if getattr(args, 'run', None) is None:  # `clipserve export` without its kind: argparse asked for it
        parser().parse_args([args.command, '--help'])
    try:
        status = args.run(args)
    except UsageError as error:
        print(f'clipserve {args.command}: {error}', file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:  # `clipserve models | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 0
    raise SystemExit(status or 0)
