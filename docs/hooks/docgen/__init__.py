"""The docs' reference pages, generated from the code at every `mkdocs build` (docs/hooks/mkdocs_hooks.py).

Run with the project's interpreter (it imports clipserve, jina and the CLI's parsers):

    PYTHONPATH=docs/hooks:executors:client .venv/bin/python -m docgen          # JSON {page path: markdown}
    PYTHONPATH=docs/hooks:executors:client .venv/bin/python -m docgen --check  # exit 1 on undocumented items

Each module reads one source of truth and returns its rows (for the tests, tests/docs/test_reference.py)
and its page: settings.py (EXECUTOR_SETTINGS, the gateways' GATEWAY_SETTINGS and signatures, every
CLIPSERVE_* variable the code reads), metrics.py (the Metrics classes' Prometheus collectors),
cli.py (the argparse parsers of `python -m clipserve`), endpoints.py (the executors' endpoints and the
request parameters the code reads), modules.py (the package's modules and their docstrings).
"""
