"""`python -m docgen [--check]`: print the generated pages as JSON {path: markdown}, or check them."""

from __future__ import annotations

import json
import os
import sys
import warnings


def pages() -> dict[str, str]:
    from docgen import cli, endpoints, flows, metrics, modules, settings

    return {
        'reference/settings.md': settings.settings_page(),
        'reference/environment.md': settings.environment_page(),
        'reference/endpoints.md': endpoints.endpoints_page(),
        'reference/metrics.md': metrics.metrics_page(),
        'reference/flows.md': flows.flows_page(),
        'reference/cli.md': cli.cli_page(),
        'reference/modules.md': modules.modules_page(),
    }


def main() -> None:
    os.environ.setdefault('JINA_OPTOUT_TELEMETRY', '1')
    os.environ.setdefault('JINA_LOG_LEVEL', 'ERROR')
    warnings.simplefilter('ignore')
    if sys.argv[1:] == ['--check']:
        from docgen.check import problems

        found = problems()
        print('\n'.join(found) or 'every setting, variable, metric, parameter and CLI option is described')
        raise SystemExit(1 if found else 0)
    json.dump(pages(), sys.stdout)


if __name__ == '__main__':
    main()
