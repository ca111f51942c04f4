"""Markdown helpers for the generated pages."""

from __future__ import annotations

GENERATED_NOTE = (
    '!!! info "Generated"\n    This page is generated from the code at every docs build (`{source}`); '
    'edit the code, not the page.\n'
)


def cell(value) -> str:
    """One table cell: pipes escaped, newlines folded, None as a dash."""
    if value is None or value == '' or value == ():
        return '-'
    return str(value).replace('|', '\\|').replace('\n', ' ')


def code(value) -> str:
    if value is None or value == '' or value == ():
        return '-'
    if isinstance(value, (tuple, list)):
        value = ','.join(str(v) for v in value)
    if isinstance(value, bool):
        value = str(value).lower()
    return f'`{value}`'


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(cell(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines) + '\n'


def page(title: str, source: str, *parts: str) -> str:
    return f'# {title}\n\n' + GENERATED_NOTE.format(source=source) + '\n' + '\n'.join(parts)
