"""The command-line reference: every command of `clipserve` (= `python -m clipserve`), read from the one parser
clipserve/cli builds (its subcommands, and theirs), so the page shows exactly what the command parses."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from docgen.markdown import page, table


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def subcommands() -> list[tuple[str, ...]]:
    """The words of every command that runs (the leaves: `export onnx`, not `export`), in the parser's order."""
    from clipserve.cli import parser

    found, todo = [], [((word,), child) for word, child in _subparsers(parser()).items()]
    while todo:
        words, command = todo.pop(0)
        children = [((*words, word), child) for word, child in _subparsers(command).items()]
        if children:
            todo[0:0] = children
        else:
            found.append(words)
    return found


def parser_of(words: tuple[str, ...]) -> argparse.ArgumentParser:
    from clipserve.cli import parser

    command = parser()
    for word in words:
        command = _subparsers(command)[word]
    return command


@dataclass(frozen=True)
class Option:
    command: str
    flags: str
    help: str | None
    default: object
    choices: tuple
    required: bool


def options(words: tuple[str, ...]) -> list[Option]:
    """The documented options of one command (help=SUPPRESS ones are internal and left out)."""
    parser = parser_of(words)
    formatter = parser._get_formatter()
    found = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.help == argparse.SUPPRESS:
            continue
        flags = ', '.join(action.option_strings) or action.dest
        text = formatter._expand_help(action) if action.help else None
        default = None if action.default in (None, False, [], argparse.SUPPRESS) else action.default
        found.append(Option(parser.prog, flags, text, default, tuple(action.choices or ()), bool(action.required)))
    return found


def cli_page() -> str:
    from clipserve.cli import EXIT_CODES

    parts = [
        '`clipserve COMMAND` (the console script) and `python -m clipserve COMMAND` are the same command line; '
        "`clipserve COMMAND --help` prints each section below. clip-as-service's form still works: "
        '`python -m clipserve flows/torch.yml` serves that Flow. ' + EXIT_CODES[0].upper() + EXIT_CODES[1:] + '\n'
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
            (parser.description or '').replace('\n', ' ') + '\n',
            f'```text\n{usage}\n```\n',
            table(('option', 'description', 'choices', 'default'), rows),
        ]
    return page('Command line', 'the argparse parsers of clipserve.cli', *parts)
