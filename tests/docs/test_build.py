"""`mkdocs build --strict` of the site, in its own venv, and checks that the built site works offline.

`.venv-docs` is made when missing (`python3 -m venv` + `pip install -r docs/requirements.txt`; the registries
are reachable in CI) and rebuilt when docs/requirements.txt changes. The build runs the reference generator
with this interpreter (CLIPSERVE_DOCS_PYTHON). Each step's time is printed (`pytest -s`, or the summary).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest
from filelock import FileLock

from tests.docs.blocks import ROOT

sys.path.insert(0, str(ROOT / 'docs' / 'hooks'))

from docgen import metrics, settings  # noqa: E402

VENV = ROOT / '.venv-docs'
REQUIREMENTS = ROOT / 'docs' / 'requirements.txt'
STAMP = VENV / 'requirements.sha256'
# tags and attributes that make a browser fetch something (links to other sites, <a href>, are fine)
FETCHED = {
    ('script', 'src'),
    ('link', 'href'),
    ('img', 'src'),
    ('iframe', 'src'),
    ('source', 'src'),
    ('video', 'src'),
    ('audio', 'src'),
    ('embed', 'src'),
    ('object', 'data'),
    ('image', 'href'),
}
CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])(https?:)?//""")
CDN_HOSTS = ('fonts.googleapis.com', 'fonts.gstatic.com', 'unpkg.com', 'cdn.jsdelivr.net', 'cdnjs.cloudflare.com')


def docs_venv() -> Path:
    """.venv-docs with docs/requirements.txt installed, made once (under a lock) and when they change."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    with FileLock(str(ROOT / '.venv-docs.lock')):
        if not (STAMP.is_file() and STAMP.read_text() == digest and (VENV / 'bin' / 'mkdocs').exists()):
            subprocess.run(['python3', '-m', 'venv', '--clear', str(VENV)], check=True)
            pip = [str(VENV / 'bin' / 'pip'), 'install', '-q', '--disable-pip-version-check', '-r', str(REQUIREMENTS)]
            done = subprocess.run(pip, capture_output=True, text=True)
            assert done.returncode == 0, f'pip install -r docs/requirements.txt failed:\n{done.stderr[-4000:]}'
            STAMP.write_text(digest)
    return VENV


class Fetches(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.mermaid = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if (tag, name) in FETCHED and value:
                self.urls.append(value)
            if name == 'class' and value and 'mermaid' in value.split():
                self.mermaid = True  # Material's bundle would load mermaid from unpkg.com for it


def external(url: str) -> bool:
    parsed = urlparse(url)
    return bool(parsed.netloc) or parsed.scheme in ('http', 'https')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    started = time.monotonic()
    venv = docs_venv()
    ready = time.monotonic()
    out = tmp_path_factory.mktemp('site')
    env = {**os.environ, 'CLIPSERVE_DOCS_PYTHON': sys.executable, 'NO_MKDOCS_2_WARNING': '1'}
    command = [str(venv / 'bin' / 'mkdocs'), 'build', '--strict', '--site-dir', str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    built = time.monotonic()
    print(f'\n.venv-docs ready in {ready - started:.1f} s, mkdocs build --strict in {built - ready:.1f} s')
    assert done.returncode == 0, f'mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}'
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in (
        'index.html',
        'getting-started.html',
        'security.html',
        'limits.html',
        'troubleshooting.html',
        'support-matrix.html',
        'changelog.html',
        'bulk.html',
        'containers.html',
        'how-to/migrate.html',
    ):
        assert (site / page).is_file(), page
    assert 'clip_client' in (site / 'getting-started.html').read_text()  # the README's snippets were included


def test_the_benchmarks_page_shows_a_plot_for_every_published_run(site):
    """Drawn at build time from the committed result files, not copied from a machine's benchmarks/results."""
    page = (site / 'benchmarks.html').read_text()
    published = sorted(p.stem for p in (ROOT / 'benchmarks' / 'published').glob('*.json'))
    assert published
    for name in published:
        image = site / 'assets' / 'benchmarks' / f'{name}.png'
        assert image.is_file() and image.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', name
        assert f'assets/benchmarks/{name}.png' in page and f'benchmarks/published/{name}.json' in page, name


def test_the_reference_holds_every_variable_and_metric(site):
    environment = (site / 'reference' / 'environment.html').read_text()
    for variable in settings.variables_in_code():
        assert variable in environment, variable
    page = (site / 'reference' / 'metrics.html').read_text()
    for metric in metrics.collect():
        assert metric.exposed[0] in page, metric.name
    assert 'encode' in (site / 'reference' / 'python-client.html').read_text()  # mkdocstrings rendered the API


def test_the_site_loads_nothing_from_other_hosts(site):
    found = []
    for path in site.rglob('*.html'):
        parser = Fetches()
        parser.feed(path.read_text(encoding='utf-8'))
        found += [f'{path.relative_to(site)}: {url}' for url in parser.urls if external(url)]
        if parser.mermaid:
            found.append(f'{path.relative_to(site)}: a mermaid diagram (loaded from unpkg.com)')
    for path in site.rglob('*.css'):
        if CSS_URL.search(path.read_text(encoding='utf-8', errors='replace')):
            found.append(f'{path.relative_to(site)}: a url() or @import from another host')
    for path in site.rglob('*.html'):
        text = path.read_text(encoding='utf-8')
        found += [f'{path.relative_to(site)}: {host}' for host in CDN_HOSTS if host in text]
    assert not found, 'the site fetches from other hosts:\n' + '\n'.join(found[:20])


def test_the_offline_check_finds_a_cdn_font(tmp_path):
    """The check can fail: Material's default Google font, a CDN script."""
    parser = Fetches()
    parser.feed(
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="https://unpkg.com/iframe-worker/shim"></script><a href="https://example.com">x</a>'
    )
    assert [u for u in parser.urls if external(u)] == [
        'https://fonts.googleapis.com/css?family=Roboto',
        'https://unpkg.com/iframe-worker/shim',
    ]
    assert CSS_URL.search('@font-face{src:url("https://fonts.gstatic.com/x.woff2")}')
    assert not CSS_URL.search('src:url("../fonts/x.woff2")')
