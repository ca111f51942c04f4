"""Show a profile() result as the tree clip-client prints."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.tree import Tree


def _row(title: str, milliseconds: float, share: float) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row(title, f'[b]{milliseconds:.0f}[/b]ms', f'[dim]{share * 100:.0f}%[/dim]')
    return table


def print_profile(report: dict[str, float], console: Console | None = None) -> None:
    roundtrip, server = report['Roundtrip'], report['Server']
    tree = Tree(_row('Roundtrip', roundtrip, 1))
    network = report['Client-server network']
    tree.add(_row('Client-server network', network, network / roundtrip if roundtrip else 0))
    branch = tree.add(_row('Server', server, server / roundtrip if roundtrip else 0))
    for name in ('Gateway-CLIP network', 'CLIP model'):
        branch.add(_row(name, report[name], report[name] / server if server else 0))
    (console or Console()).print(tree)
