"""Make the lock files in locks/: every distribution each install flavour holds, pinned to one version with
the hashes of its files, so that an install made twice (a CI run, a user's checkout, a container image)
holds the same versions. constraints.txt pins what CI proves together; the locks pin the rest too.

    python deploy/lock.py            # rewrite locks/*.txt from pyproject.toml and constraints.txt
    python deploy/lock.py --check    # make them again in a scratch folder; exit 1 naming the locks that differ

The resolution is uv's (`uv pip compile --universal`: one file for every Linux Python from 3.11, markers
where versions differ), from PyPI, ignoring files published after EXCLUDE_NEWER: the same inputs give the same
locks on any day, which is what lets CI check them. After changing a pin in constraints.txt or a dependency in
pyproject.toml, move EXCLUDE_NEWER to the present (a time already past: files published later in the same
day would otherwise change a later check) and run this. Every flavour but `base` is resolved within
locks/base.txt, so the Dockerfile's shared first layer (the base lock) stays valid under every variant's.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / 'locks'
# a moment already past when the locks were made: no file can still appear before it
EXCLUDE_NEWER = '2026-12-05T12:00:00Z'
INDEX = 'https://pypi.org/simple'
PYTHON = '3.11'
# lock name -> what it installs (pip requirement lines, relative to the repository's root) and who uses it
FLAVOURS = {
    'base': (['.'], "the Dockerfile's first layer, shared by every variant"),
    'serve': (['.[torch,search]'], "the README's step 1: serve on PyTorch, with an index"),
    'test': (['.[torch,onnx,test]', './client[jina,progress]'], "the README's step 2: the test suite, CI"),
    'cpu-onnx': (['.[onnx]'], "the Dockerfile's cpu-onnx variant"),
    'cpu-openvino': (['.[openvino]'], "the Dockerfile's cpu-openvino variant"),
    'cuda': (['.[torch,onnx-gpu]'], "the Dockerfile's cuda variant"),
}
LOCAL = ('clipserve', 'clipserve-client')  # installed from the checkout (pip install --no-deps -e .), not locked


def uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        found = shutil.which('uv')
        if not found:
            sys.exit('deploy/lock.py needs uv: pip install uv (the test extra has it)')
        return found
    return find_uv_bin()


def compile_lock(name: str) -> str:
    """The lock of the flavour `name`, by one `uv pip compile` (within locks/base.txt unless it is the base)."""
    requirements, used_by = FLAVOURS[name]
    command = [uv(), 'pip', 'compile', '-', '--quiet', '--universal', '--python-version', PYTHON, '--no-header']
    command += ['--generate-hashes', '--exclude-newer', EXCLUDE_NEWER, '--default-index', INDEX]
    command += ['--constraint', 'constraints.txt']
    if name != 'base':
        command += ['--constraint', 'locks/base.txt']
    for package in LOCAL:
        command += ['--no-emit-package', package]
    # no --output-file: uv would prefer the versions of an existing one, and a rewrite could differ from a check
    result = subprocess.run(command, cwd=ROOT, input='\n'.join(requirements) + '\n', capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout:
        sys.exit(f'deploy/lock.py: uv could not lock {name}:\n{result.stderr}')
    header = (
        f'# locks/{name}.txt: {used_by}. Made by `python deploy/lock.py` from pyproject.toml ({", ".join(requirements)})\n'
        f'# and constraints.txt; do not edit. Install: pip install --no-deps --require-hashes -r locks/{name}.txt\n'
    )
    return header + result.stdout


def make(into: Path) -> list[Path]:
    """Every lock into the folder `into` (the base first: the others are resolved within the committed one)."""
    into.mkdir(parents=True, exist_ok=True)
    made = []
    for name in FLAVOURS:
        made.append(into / f'{name}.txt')
        made[-1].write_text(compile_lock(name))
    return made


def check() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        made = make(Path(scratch))
        stale = []
        for path in made:
            committed = LOCKS / path.name
            old = committed.read_text().splitlines() if committed.exists() else []
            new = path.read_text().splitlines()
            if old != new:
                diff = list(difflib.unified_diff(old, new, f'locks/{path.name}', 'made now', lineterm='', n=0))
                stale.append(f'locks/{path.name} differs from what deploy/lock.py makes:\n' + '\n'.join(diff[:40]))
    if stale:
        print('\n\n'.join(stale) + '\n\nrun: python deploy/lock.py', file=sys.stderr)
        return 1
    print(f'locks/: {len(made)} locks, each what deploy/lock.py makes')
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true', help='make the locks in a scratch folder and compare')
    if parser.parse_args().check:
        return check()
    made = make(LOCKS)
    print('\n'.join(f'{p.relative_to(ROOT)}: {sum(1 for line in p.open() if line[:1].isalnum())} pins' for p in made))
    return 0


if __name__ == '__main__':
    sys.exit(main())
