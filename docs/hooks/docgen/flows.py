"""The Flows reference: every shipped flows/*.yml with its header comment, gateway, ports and executors."""

from __future__ import annotations

import yaml

from docgen.markdown import page, table
from docgen.settings import ROOT


def header(text: str) -> str:
    """The comment lines before the YAML starts, without their `#`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith('#'):
            break
        lines.append(line[1:].removeprefix(' '))
    return '\n'.join(lines)


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def flow_rows() -> list[tuple[str, str, str, str]]:
    """(file, gateway, protocols and ports, executors) of each shipped Flow."""
    rows = []
    for path in sorted((ROOT / 'flows').glob('*.yml')):
        config = yaml.safe_load(path.read_text(encoding='utf-8'))
        gateway = config.get('gateway') or config.get('with') or {}
        protocols = _listed(gateway.get('protocol', 'grpc'))
        ports = _listed(gateway.get('port', ''))
        served = ', '.join(f'{p} {port}' for p, port in zip(protocols, ports))
        if gateway.get('ssl_certfile'):
            served += ', TLS'
        if gateway.get('monitoring') or (config.get('with') or {}).get('monitoring'):
            served += f', metrics {gateway.get("port_monitoring") or config["with"].get("port_monitoring")}'
        executors = []
        for executor in config.get('executors', []):
            uses = executor.get('uses')
            kind = uses.get('jtype') if isinstance(uses, dict) else str(uses)
            backend = (uses.get('with') or {}).get('backend', 'torch') if isinstance(uses, dict) else '?'
            extra = [f'{executor[k]} {k}' for k in ('replicas', 'shards') if int(executor.get(k, 1) or 1) > 1]
            if executor.get('monitoring'):
                extra.append(f'metrics {executor.get("port_monitoring")}')
            executors.append(
                f'`{executor.get("name")}`: {kind} on {backend}' + (f' ({", ".join(extra)})' if extra else '')
            )
        rows.append((f'`flows/{path.name}`', gateway.get('uses', "Jina's"), served, '<br>'.join(executors)))
    return rows


INTRO = """The Flow files shipped in `flows/` (also installed with the package: `python -m clipserve NAME.yml` finds them).
Each reads its model from the environment (`CLIPSERVE_MODEL`, `CLIPSERVE_DEVICE`, `CLIPSERVE_DTYPE`,
`CLIPSERVE_MODEL_PATH`, ...; see [environment variables](environment.md)), so none needs editing to serve
another model. Start one with `jina flow --uses flows/NAME.yml` or `python -m clipserve NAME.yml`.
"""


def flows_page() -> str:
    parts = [INTRO, table(('file', 'gateway', 'ports', 'executors'), flow_rows())]
    for path in sorted((ROOT / 'flows').glob('*.yml')):
        parts += [f'## `flows/{path.name}`\n', f'```text\n{header(path.read_text(encoding="utf-8"))}\n```\n']
    return page('Flows', 'flows/*.yml', *parts)
