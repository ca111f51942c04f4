"""The command-line reference: the parsers `python -m clipserve` builds, captured as each subcommand builds them.

`clipserve.__main__.main` dispatches on the first words (`argv[:1] == ['models']`, `argv[:2] == ['export',
'onnx']`, ...) and each subcommand builds its own argparse parser. The subcommands are read from main's
source (every such comparison, plus the bare command that serves a Flow); each is then called with
`ArgumentParser.parse_args` replaced by a function that hands the parser back instead of parsing, so nothing
runs and the page shows exactly the parser the command uses.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

from docgen.markdown import page, table


class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


@contextmanager
def _capturing():
    def capture(parser, *args, **kwargs):
        raise _Captured(parser)

    with mock.patch.object(argparse.ArgumentParser, 'parse_args', capture):
        yield


def subcommands() -> list[tuple[str, ...]]:
    """The words of every subcommand main() dispatches on, and () for the bare command."""
    from clipserve import __main__ as cli

    tree = ast.parse(inspect.getsource(cli.main))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript):
            for comparator in node.comparators:
                if isinstance(comparator, ast.List) and all(isinstance(e, ast.Constant) for e in comparator.elts):
                    found.append(tuple(e.value for e in comparator.elts))
    return [(), *found]


def parser_of(words: tuple[str, ...]) -> argparse.ArgumentParser:
    from clipserve import __main__ as cli

    with _capturing():
        try:
            cli.main(list(words))
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f'python -m clipserve {" ".join(words)} built no parser')


@dataclass(frozen=True)
class Option:
    command: str
    flags: str
    help: str | None
    default: object
    choices: tuple
    required: bool


def options(words: tuple[str, ...]) -> list[Option]:
    """The documented options of one subcommand (help=SUPPRESS ones are internal and left out)."""
    parser = parser_of(words)
    formatter = parser._get_formatter()
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        flags = ', '.join(action.option_strings) or action.dest
        text = formatter._expand_help(action) if action.help else None
        default = None if action.default in (None, False, [], argparse.SUPPRESS) else action.default
        found.append(Option(parser.prog, flags, text, default, tuple(action.choices or ()), bool(action.required)))
    return found


def cli_page() -> str:
    parts = [
        "Every subcommand of `python -m clipserve` (also the container image's ENTRYPOINT). "
        '`python -m clipserve COMMAND --help` prints the same.\n'
    ]
    for words in subcommands():
        parser = parser_of(words)
        rows = []
        for o in options(words):
            kind = ', '.join(f'`{c}`' for c in o.choices) if o.choices else ''
            default = 'required' if o.required else (f'`{o.default}`' if o.default is not None else '')
            rows.append((f'`{o.flags}`', o.help, kind, default))
        usage = parser.format_usage().strip().removeprefix('usage: ')
        parts += [
            f'## `{parser.prog}`\n',
            (parser.description or '') + '\n',
            f'```text\n{usage}\n```\n',
            table(('option', 'description', 'choices', 'default'), rows),
        ]
    return page('Command line', 'the argparse parsers of clipserve.__main__ and clipserve.jobs.cli', *parts)
