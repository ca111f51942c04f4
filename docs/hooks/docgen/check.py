"""What the reference cannot describe: items of the code without a description, and descriptions of nothing.

Each function returns 'kind item: problem' lines; tests/docs/test_reference.py runs them one by one.
"""

from __future__ import annotations

from docgen import cli, endpoints, metrics, settings


def undescribed_settings() -> list[str]:
    rows = [('executor', r) for r in settings.executor_rows()] + [('gateway', r) for r in settings.gateway_rows()]
    return [f'{where} setting {r.name}: no description' for where, r in rows if not r.description.strip()]


def stale_gateway_arguments() -> list[str]:
    names = {r.name for r in settings.gateway_rows()}
    return [
        f'gateway argument {n}: described in docgen but no gateway takes it'
        for n in settings.GATEWAY_ARGUMENTS
        if n not in names
    ]


def undescribed_variables() -> list[str]:
    documented = {v for v, _, _ in settings.variable_rows()}
    in_code = settings.variables_in_code()
    missing = [
        f'variable {v}: read by {", ".join(sorted(files))} but not documented'
        for v, files in sorted(in_code.items())
        if v not in documented
    ]
    stale = [f'variable {v}: documented but nothing reads it' for v in settings.other_variables() if v not in in_code]
    return missing + stale


def undescribed_metrics() -> list[str]:
    return [f'metric {m.name} ({m.cls}): no help text' for m in metrics.collect() if not m.help.strip()]


def undescribed_options() -> list[str]:
    found = []
    for words in cli.subcommands():
        for option in cli.options(words):
            if not (option.help or '').strip():
                found.append(f'option {option.command} {option.flags}: no help')
    return found


def undescribed_parameters() -> list[str]:
    in_code = endpoints.parameters_in_code()
    missing = [
        f'parameter {p}: read by {", ".join(sorted(files))} but not documented'
        for p, files in sorted(in_code.items())
        if p not in endpoints.PARAMETERS
    ]
    stale = [f'parameter {p}: documented but nothing reads it' for p in endpoints.PARAMETERS if p not in in_code]
    return missing + stale


CHECKS = (
    undescribed_settings,
    stale_gateway_arguments,
    undescribed_variables,
    undescribed_metrics,
    undescribed_options,
    undescribed_parameters,
)


def problems() -> list[str]:
    return [line for check in CHECKS for line in check()]
