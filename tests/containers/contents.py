"""What an image holds, read inside it by its own Python: its Python, its distributions, build tools and
caches it must not have, and digests of the files it serves from (config.yml and the Hub folders)."""

from __future__ import annotations

import json

BUILD_TOOLS = ('gcc', 'cc', 'c++', 'g++', 'clang', 'make', 'ld', 'as')

# What an image holds, read inside it by its own Python (as root, to see /root; no network).
FACTS = r"""
import hashlib, importlib.metadata as md, json, os, shutil, sys
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None
def size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))
def digest(path):
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()
try:
    import torch
    has_torch = True
except ImportError:
    has_torch = False
hub = {os.path.relpath(os.path.join(d, f), '/srv/clipserve'): digest(os.path.join(d, f))
       for d, _, fs in os.walk('/srv/clipserve/hub') for f in fs}
print(json.dumps({
    'python': sys.version.split()[0],
    'torch': has_torch,
    'tools': {tool: shutil.which(tool) for tool in sys.argv[1].split(',')},
    'folders': {p: listing(p) for p in ('/root/.cache', '/home/clipserve/.cache', '/tmp', '/src',
                                         '/var/lib/apt/lists', '/var/cache/apt/archives')},
    'distributions': {d.metadata['Name']: d.version for d in md.distributions()},
    'clipserve_extras': md.metadata('clipserve').get_all('Provides-Extra'),
    'venv_bytes': size('/opt/venv'),
    'files': {'config.yml': digest('/srv/clipserve/config.yml'), **hub},
}))
"""
_FACTS: dict[str, dict] = {}


def image_facts(docker, tag: str) -> dict:
    if tag not in _FACTS:
        result = docker(
            'run', '--rm', '--network', 'none', '--user', '0', '--entrypoint', 'python', tag, '-c', FACTS,
            ','.join(BUILD_TOOLS),
        )  # fmt: skip
        _FACTS[tag] = json.loads(result.stdout)
    return _FACTS[tag]
