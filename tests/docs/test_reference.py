"""The reference the docs generate from the code (docs/hooks/docgen) describes everything the code has.

A setting, gateway argument, CLIPSERVE_* variable, metric, request parameter or CLI option without a
description fails here, as does a description of something the code no longer has. Known gaps in code this
project's docs do not own are marked xfail(strict): the mark fails too once the gap is closed.
"""

from __future__ import annotations

import sys

import pytest

from tests.docs.blocks import ROOT

sys.path.insert(0, str(ROOT / 'docs' / 'hooks'))

from docgen import check, cli, endpoints, metrics, settings  # noqa: E402

# CLI options in executors/ without help text (the docs cannot fix them): report, keep CI green, notice the fix
KNOWN_UNDESCRIBED_OPTIONS: set[str] = set()


@pytest.mark.parametrize(
    'find', [c for c in check.CHECKS if c is not check.undescribed_options], ids=lambda f: f.__name__
)
def test_everything_is_described(find):
    assert find() == []


def _options():
    return [(words, option) for words in cli.subcommands() for option in cli.options(words)]


@pytest.mark.parametrize(
    'option',
    [
        pytest.param(
            option,
            marks=[
                pytest.mark.xfail(
                    strict=True,
                    reason='no help= in the parser: once it has one, drop it from KNOWN_UNDESCRIBED_OPTIONS',
                )
            ]
            if f'{option.command} {option.flags.split(",")[0]}' in KNOWN_UNDESCRIBED_OPTIONS
            else [],
            id=f'{option.command} {option.flags}',
        )
        for _, option in _options()
    ],
)
def test_every_cli_option_has_help(option):
    assert (option.help or '').strip(), f'{option.command} {option.flags} has no help'


def test_the_cli_reference_covers_every_subcommand():
    commands = {' '.join(words) for words in cli.subcommands()}
    assert {'serve', 'models', 'embed', 'index', 'export onnx', 'export reranker', 'ready'} <= commands
    page = cli.cli_page()
    for words in cli.subcommands():
        assert f'## `{cli.parser_of(words).prog}`' in page


def test_settings_reference_lists_every_setting_with_its_variable():
    page = settings.settings_page()
    for row in settings.executor_rows() + settings.gateway_rows():
        assert f'| `{row.name}`' in page
        if row.variable:
            assert f'`{row.variable}`' in page


def test_the_environment_reference_holds_every_variable_the_code_reads():
    page = settings.environment_page()
    for variable in settings.variables_in_code():
        assert f'`{variable}`' in page, variable


def test_metrics_come_from_the_registries_and_match_the_tables():
    """Every metric a Metrics class registers is listed, with the labels of the METRICS tables where there are."""
    from clipserve.serving.gateway import metrics as gateway_metrics
    from clipserve.serving.replica import metrics as executor_metrics

    found = {m.name: m for m in metrics.collect()}
    for table, extra in ((executor_metrics.METRICS, executor_metrics.LABELS), (gateway_metrics.METRICS, ())):
        for name, (kind, labels, text) in table.items():
            assert name in found, name
            assert (found[name].kind, found[name].labels, found[name].help) == (kind, extra + tuple(labels), text)
    assert any(name.startswith('clipserve_openai_') for name in found)  # the gateway's OpenAI routes'
    page = metrics.metrics_page()
    for metric in found.values():
        assert metric.exposed[0] in page


def test_request_parameters_are_the_ones_the_code_reads():
    assert set(endpoints.parameters_in_code()) == set(endpoints.PARAMETERS)
    rows = endpoints.endpoint_rows()
    assert ('CLIPEncoder', '`/encode/<model>`') in {(r[0], r[1]) for r in rows}
    assert ('CLIPRanker', '`/rank`') in {(r[0], r[1]) for r in rows}


def test_a_missing_description_is_found(monkeypatch):
    """The checks can fail: a setting without a description, an undocumented variable and parameter."""
    from clipserve.config import settings as code_settings

    blank = code_settings.Setting('new_thing', 'int', 1, ' ')
    monkeypatch.setattr(code_settings, 'EXECUTOR_SETTINGS', (*code_settings.EXECUTOR_SETTINGS, blank))
    assert check.undescribed_settings() == ['executor setting new_thing: no description']
    from clipserve import environment

    unread = environment.Variable('CLIPSERVE_NOTHING_READS_THIS', '-', 'x')
    monkeypatch.setattr(environment, 'VARIABLES', (*environment.VARIABLES, unread))
    assert 'variable CLIPSERVE_NOTHING_READS_THIS: documented but nothing reads it' in check.undescribed_variables()
    monkeypatch.delitem(endpoints.PARAMETERS, 'reuse_embeddings')
    assert any(p.startswith('parameter reuse_embeddings: read by') for p in check.undescribed_parameters())


def test_the_generator_follows_the_code_rules():
    """docs/hooks is outside tests/test_code_rules.py's folders: the same ruff lint, format and size rule here."""
    import subprocess

    ruff = str(ROOT / '.venv' / 'bin' / 'ruff') if (ROOT / '.venv' / 'bin' / 'ruff').exists() else 'ruff'
    for command in ([ruff, 'check', 'docs/hooks'], [ruff, 'format', '--check', 'docs/hooks']):
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    long = [str(p) for p in (ROOT / 'docs' / 'hooks').rglob('*.py') if len(p.read_text().splitlines()) > 400]
    assert not long
