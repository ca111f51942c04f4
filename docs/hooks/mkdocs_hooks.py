"""mkdocs hooks (mkdocs.yml `hooks:`): the generated reference pages, the benchmark plots, placeholders.

- on_files: runs the generator (`python -m docgen`, docs/hooks/docgen) with the project's interpreter, which
  imports clipserve, and adds its pages (reference/*.md) to the site as generated files: nothing is written
  into docs/, so the reference cannot go stale. The interpreter is $CLIPSERVE_DOCS_PYTHON, else the
  checkout's .venv/bin/python (the README's install), else this one. Also draws the benchmark plots from
  the committed result files, benchmarks/published/NAME.json, with benchmarks/plots.py (matplotlib, in the
  docs' own environment), as assets/benchmarks/NAME.png: the site shows the runs its tables quote, whoever
  builds it. And a placeholder for a page the nav names that another engineer is still writing
  (PAGES_BEING_WRITTEN), so the build stays strict.
- on_page_markdown: `<!-- plot: NAME -->` becomes the plot with a line naming its run (machine, date), or,
  without a published result, a line saying which script measures it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PYTHON_ENV = 'CLIPSERVE_DOCS_PYTHON'
PUBLISHED = ROOT / 'benchmarks' / 'published'
PLOT_DIR = 'assets/benchmarks'
PLOT = re.compile(r'<!-- plot: ([\w-]+) -->')
PAGES_BEING_WRITTEN = {
    'limits.md': 'Limits',
    'docarray-v2.md': 'DocArray v2',
}


def project_python() -> str:
    if os.environ.get(PYTHON_ENV):
        return os.environ[PYTHON_ENV]
    venv = ROOT / '.venv' / 'bin' / 'python'
    return str(venv) if venv.exists() else sys.executable


def generate() -> dict[str, str]:
    """{page path: markdown} from `python -m docgen`."""
    paths = [ROOT / 'docs' / 'hooks', ROOT / 'executors', ROOT / 'client']
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(str(p) for p in paths)}
    python = project_python()
    started = time.monotonic()
    try:
        done = subprocess.run([python, '-m', 'docgen'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PluginError(f'the reference generator did not run with {python}: {error}') from error
    if done.returncode != 0:
        raise PluginError(
            f'the reference generator failed with {python} (set {PYTHON_ENV} to an interpreter with clipserve '
            f'installed):\n{done.stderr[-4000:]}'
        )
    pages = json.loads(done.stdout)
    print(f'INFO    -  clipserve reference: {len(pages)} pages in {time.monotonic() - started:.1f} s ({python})')
    return pages


def on_files(files, config):
    for path, text in generate().items():
        files.append(File.generated(config, path, content=text))
    for name in draw_plots():
        files.append(File.generated(config, f'{PLOT_DIR}/{name}.png', abs_src_path=str(DRAWN / f'{name}.png')))
    for path, title in PAGES_BEING_WRITTEN.items():
        if files.get_file_from_path(path) is None:
            text = f'# {title}\n\n!!! note "Being written"\n    `docs/{path}` is being written; it appears here once it is.\n'
            files.append(File.generated(config, path, content=text))
    return files


DRAWN = Path(tempfile.mkdtemp(prefix='clipserve-plots-'))


def draw_plots() -> list[str]:
    """The names of the plots drawn into DRAWN from benchmarks/published/*.json."""
    spec = importlib.util.spec_from_file_location('clipserve_benchmark_plots', ROOT / 'benchmarks' / 'plots.py')
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise PluginError(f'the benchmark plots need matplotlib (docs/requirements.txt): {error}') from error
    drawn = plots.draw_all(PUBLISHED, DRAWN)
    print(f'INFO    -  clipserve plots: {", ".join(drawn) or "none"} from {PUBLISHED.relative_to(ROOT)}')
    return drawn


def _plot(match: re.Match, page) -> str:
    name = match.group(1)
    if (DRAWN / f'{name}.png').is_file():
        depth = page.file.src_uri.count('/')
        run = json.loads((PUBLISHED / f'{name}.json').read_text()).get('machine', {})
        where = ', '.join(str(run[k]) for k in ('cpu', 'when') if run.get(k))
        cores = f', {run["cores"]} cores' if run.get('cores') else ''
        caption = f'*Drawn from `benchmarks/published/{name}.json`' + (f' ({where}{cores})' if where else '') + '.*'
        return f'![{name}]({"../" * depth}{PLOT_DIR}/{name}.png)\n\n{caption}'
    return (
        f'*(No published run of `benchmarks/{name}.py` yet: its plot is drawn from '
        f'`benchmarks/published/{name}.json` once one is committed.)*'
    )


def on_page_markdown(markdown, page, config, files):
    return PLOT.sub(lambda m: _plot(m, page), markdown)


def on_shutdown():
    import shutil

    shutil.rmtree(DRAWN, ignore_errors=True)
