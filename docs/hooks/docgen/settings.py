"""The settings reference: every executor and gateway setting, and every CLIPSERVE_* variable the code reads.

Sources: `clipserve.config.settings.EXECUTOR_SETTINGS` (name, kind, default, description, variable),
`clipserve.config.gateway_settings.GATEWAY_SETTINGS` (the gateway's limits and routes) and the gateways'
constructor signatures (`ReadyGateway`, `ClipServeGateway`); a gateway argument outside GATEWAY_SETTINGS takes
its default from the signature and its description from GATEWAY_ARGUMENTS below.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from docgen.markdown import code, page, table

ROOT = Path(__file__).resolve().parents[3]
MiB = 1024 * 1024

# gateway arguments that are not in GATEWAY_SETTINGS: name -> (variable, description)
GATEWAY_ARGUMENTS = {
    'auth': (
        'CLIPSERVE_AUTH',
        '`ClipServeGateway` only: `required` (no token, no start), `optional` (checked when '
        '`CLIPSERVE_AUTH_TOKEN` is set) or `off` (logged at every start); the variable where the argument is not given.',
    ),
}


def other_variables() -> dict[str, tuple[str, str]]:
    """CLIPSERVE_* variables that are not a setting's, as the code declares them (clipserve/environment.py):
    name -> (read by, description)."""
    from clipserve import environment

    return {v.name: (v.read_by, v.description) for v in environment.VARIABLES}


VARIABLE = re.compile(r'CLIPSERVE_[A-Z0-9_]*[A-Z0-9]')
DECLARED = re.compile(r'\benvironment\.([A-Z][A-Z0-9_]*)\b')  # a read of a variable of clipserve/environment.py


@dataclass(frozen=True)
class Row:
    name: str
    kind: str
    default: object
    description: str
    variable: str | None
    section: str
    choices: tuple = ()
    minimum: float | None = None


def _rows(settings) -> list[Row]:
    return [
        Row(s.name, s.kind, s.default, s.description, s.variable, s.section, tuple(s.choices), s.minimum)
        for s in settings
    ]


def executor_rows() -> list[Row]:
    from clipserve.config.settings import EXECUTOR_SETTINGS

    return _rows(EXECUTOR_SETTINGS)


def indexer_rows() -> list[Row]:
    from clipserve.config.indexer_settings import INDEXER_SETTINGS

    return _rows(INDEXER_SETTINGS)


def reranker_rows() -> list[Row]:
    from clipserve.config.reranker_settings import RERANKER_SETTINGS

    return [r for r in _rows(RERANKER_SETTINGS) if r.section == 'reranker']


def gateway_rows() -> list[Row]:
    """GATEWAY_SETTINGS, then every other argument of the gateways' constructors."""
    from clipserve.config.gateway_settings import GATEWAY_SETTINGS
    from clipserve.serving.gateway.gateways import ClipServeGateway, ReadyGateway

    rows = _rows(GATEWAY_SETTINGS)
    known = {r.name for r in rows}
    for cls in (ReadyGateway, ClipServeGateway):
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if name in known or name == 'self' or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                continue
            known.add(name)
            variable, description = GATEWAY_ARGUMENTS.get(name, (None, ''))
            default = parameter.default
            kind = type(default).__name__ if default is not inspect.Parameter.empty else '?'
            rows.append(Row(name, kind, default, description, variable, cls.__name__))
    return rows


def variables_in_code() -> dict[str, set[str]]:
    """CLIPSERVE_* name -> the files (relative) that mention it: the package, the Hub folders and the Flows."""
    found: dict[str, set[str]] = {}
    paths = [*(ROOT / 'executors' / 'clipserve').rglob('*.py'), *(ROOT / 'executors' / 'hub').rglob('*.yml')]
    paths += sorted((ROOT / 'flows').glob('*.yml'))
    declared = ROOT / 'executors' / 'clipserve' / 'environment.py'  # where they are declared is not a read
    from clipserve import environment

    for path in paths:
        if path == declared:
            continue
        text = path.read_text(encoding='utf-8')
        names = VARIABLE.findall(text)
        names += [getattr(environment, attr).name for attr in DECLARED.findall(text) if hasattr(environment, attr)]
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def variable_rows() -> list[tuple[str, str, str]]:
    """(variable, what it sets, description) for every variable: settings' first, then the others."""
    rows = []
    sources = (
        ('executor', executor_rows()),
        ('indexer', indexer_rows()),
        ('reranker', reranker_rows()),
        ('gateway', gateway_rows()),
    )
    for where, settings in sources:
        for s in settings:
            if s.variable:
                rows.append((s.variable, f'{where} setting `{s.name}`', s.description))
    for name, (reader, description) in sorted(other_variables().items()):
        rows.append((name, reader, description))
    return rows


def format_default(row: Row) -> str:
    value = row.default
    if value is inspect.Parameter.empty:
        return '(required)'
    if row.kind == 'int' and isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f'{code(value)} ({value // MiB} MiB)'
    if row.kind == 'int' and isinstance(value, int) and value >= 10_000:
        return f'{code(value)} ({value:,})'
    return code(value)


def format_kind(row: Row) -> str:
    if row.choices:
        return ', '.join(f'`{c}`' for c in row.choices)
    bound = f' >= {row.minimum:g}' if row.minimum is not None else ''
    return f'{row.kind}{bound}'


def _settings_table(rows: list[Row]) -> str:
    return table(
        ('setting (variable)', 'type', 'default', 'description'),
        [
            (
                f'`{r.name}`' + (f'<br>`{r.variable}`' if r.variable else ''),
                format_kind(r),
                format_default(r),
                r.description,
            )
            for r in rows
        ],
    )


EXECUTOR_INTRO = """Constructor arguments of `CLIPEncoder` and `CLIPRanker`: `with:` in a Flow YAML, `uses_with` in
Python, `--uses-with` on the command line. A value comes from the argument, else its environment variable, else
the default; an empty argument or an unexpanded `${{ ENV.X }}` counts as not given, so every shipped Flow
reads its model from `CLIPSERVE_MODEL` and friends. Lists are YAML lists or one comma-separated string.
A wrong value fails the executor at start with a message naming the setting and what it accepts.
The deprecated argument `traversal_paths` still sets `access_paths` (with a warning).
"""

INDEXER_INTRO = """Constructor arguments of `CLIPIndexer` ([Search](../search.md)), read as the executors' are (argument,
else variable, else default). clip-as-service's AnnLite names are kept; AnnLite's other spellings (`dim`,
`ef_query`, `index_traversal_paths`, `search_traversal_paths`) set the same settings.
"""

RERANKER_INTRO = """Constructor arguments of `CrossEncoderRanker` ([Rerank](../rerank.md)), read as the executors' are
(argument, else variable, else default). The model's settings have variables of their own (`CLIPSERVE_RERANK_*`),
so a Flow with an encoder and a reranker sets each apart; the limits (`max_requests`, the queue, ...) and
`shutdown_grace` are the executor settings above, with the same variables.
"""

GATEWAY_INTRO = """Arguments of the gateways `ReadyGateway` (every shipped Flow) and `ClipServeGateway` (`flows/auth.yml`):
`uses_with:` under the Flow's `gateway:`. The limits also read their `CLIPSERVE_*` variable, in the
gateway's environment (the shell that runs `jina flow`).

```yaml
gateway:
  uses: ReadyGateway
  py_modules: [clipserve.serving.gateway.gateways]
  uses_with: {max_in_flight: 256, playground: false}
```
"""


def settings_page() -> str:
    by_section: dict[str, list[Row]] = {}
    for row in executor_rows():
        by_section.setdefault(row.section, []).append(row)
    parts = ['## Executor settings\n', EXECUTOR_INTRO]
    for section, rows in by_section.items():
        parts += [f'### {section.capitalize()}\n', _settings_table(rows)]
    parts += ['## Indexer settings\n', INDEXER_INTRO, _settings_table(indexer_rows())]
    parts += ['## Reranker settings\n', RERANKER_INTRO, _settings_table(reranker_rows())]
    parts += ['## Gateway settings\n', GATEWAY_INTRO, _settings_table(gateway_rows())]
    source = (
        'clipserve.config.settings.EXECUTOR_SETTINGS, clipserve.config.indexer_settings.INDEXER_SETTINGS, '
        'clipserve.config.reranker_settings.RERANKER_SETTINGS, clipserve.config.gateway_settings.GATEWAY_SETTINGS, '
        'serving/gateway/gateways.py'
    )
    return page('Settings', source, *parts)


def environment_page() -> str:
    rows = [(f'`{v}`', what, description) for v, what, description in variable_rows()]
    intro = (
        "Every `CLIPSERVE_*` variable the server reads. A setting's variable applies where its argument is not "
        'given (see [Settings](settings.md)); Flows substitute `${{ ENV.X }}` when they load, so set the variables '
        'in the shell that starts the Flow (`jina flow`, `python -m clipserve`, `docker run -e`).\n'
    )
    source = 'the settings tables, and every CLIPSERVE_* name in executors/clipserve, executors/hub and flows/'
    return page('Environment variables', source, intro, table(('variable', 'sets', 'description'), rows))
