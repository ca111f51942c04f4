"""The code map: every module of the server and the client with the first sentence of its docstring."""

from __future__ import annotations

import ast

from docgen.markdown import page, table
from docgen.settings import ROOT

PACKAGES = (('executors', 'clipserve'), ('client', 'clipserve_client'))


def module_rows() -> list[tuple[str, str, str]]:
    """(package, module, summary) read with ast: nothing is imported."""
    rows = []
    for base, package in PACKAGES:
        for path in sorted((ROOT / base / package).rglob('*.py')):
            module = '.'.join(path.relative_to(ROOT / base).with_suffix('').parts).removesuffix('.__init__')
            doc = ast.get_docstring(ast.parse(path.read_text(encoding='utf-8'))) or ''
            summary = doc.split('\n\n')[0].replace('\n', ' ')
            rows.append((module.rsplit('.', 1)[0] if '.' in module else module, module, summary))
    return rows


def modules_page() -> str:
    intro = (
        'The layers (each imports only the ones below it; import-linter checks it, `pyproject.toml '
        '[tool.importlinter]`): `errors`, `inputs`, `models`, `backends`, `engine`, `config`, then `serving` '
        "and `jobs`, then the command line. Only `serving` knows Jina and DocArray; within it the gateway's process "
        "(`serving.gateway`) and the replicas' (`serving.replica`) meet only in their door, `serving.jina`. The "
        'client imports nothing of the server.\n'
    )
    rows = [(f'`{m}`', s) for _, m, s in module_rows()]
    return page(
        'Code map',
        'the docstrings of executors/clipserve and client/clipserve_client',
        intro,
        table(('module', 'what'), rows),
    )
