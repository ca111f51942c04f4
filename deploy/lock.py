"""Make the lock files in locks/: every distribution each install flavour holds, pinned to one version with
the hashes of its files, so that an install made twice (a CI run, a user's checkout, a container image)
holds the same versions. constraints.txt pins what CI proves together; the locks pin the rest too.

    python deploy/lock.py            # rewrite locks/*.txt from pyproject.toml and constraints.txt
    python deploy/lock.py --check    # resolve again within the committed pins; exit 1 naming the locks that differ

The resolution is uv's (`uv pip compile --universal`: one file for every Linux Python from 3.11, markers
where versions differ), from PyPI, ignoring files published after EXCLUDE_NEWER, so a rewrite on a later day
does not pick up releases made since. After changing a pin in constraints.txt or a dependency in
pyproject.toml, move EXCLUDE_NEWER to the present (a time already past: files published later in the same
day would otherwise change a later rewrite) and run this. Every flavour but `base` is resolved within
locks/base.txt, so the Dockerfile's shared first layer (the base lock) stays valid under every variant's.
A check resolves each lock within its own committed pins too: registries (PyPI mirrors above all) list some
releases only after their upload date, so a fresh resolution can move on a later day; a check fails on what
the inputs change, not on what the registry learned (a file listed late adds a hash the committed lock
need not hold; one no longer listed fails); it names every lock that is wrong and why.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
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


class LockError(Exception):
    """uv found no resolution: the inputs contradict each other (or a committed lock, in a check)."""


def compile_lock(name: str, within_committed: bool = False) -> str:
    """The lock of the flavour `name`, by one `uv pip compile` (within locks/base.txt unless it is the base;
    within its own committed lock too when `within_committed`, which is how a check resolves)."""
    requirements, used_by = FLAVOURS[name]
    command = [uv(), 'pip', 'compile', '-', '--quiet', '--universal', '--python-version', PYTHON, '--no-header']
    command += ['--generate-hashes', '--exclude-newer', EXCLUDE_NEWER, '--default-index', INDEX]
    command += ['--constraint', 'constraints.txt']
    if name != 'base':
        command += ['--constraint', 'locks/base.txt']
    if within_committed and (LOCKS / f'{name}.txt').exists():
        command += ['--constraint', f'locks/{name}.txt']
    for package in LOCAL:
        command += ['--no-emit-package', package]
    # no --output-file: uv would prefer the versions of an existing one, and a rewrite could differ from a check
    result = subprocess.run(command, cwd=ROOT, input='\n'.join(requirements) + '\n', capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout:
        raise LockError(f'uv could not lock {name}:\n{result.stderr}')
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


def pins_and_hashes(lock: str) -> dict[str, set[str]]:
    """Each pin line of a lock (`name==version`, with its markers) -> the hashes under it; comments left out
    (a check's `via` notes also name the committed lock it resolved within)."""
    pins: dict[str, set[str]] = {}
    pin = None
    for line in lock.splitlines():
        line = line.strip().rstrip('\\').strip()
        if not line or line.startswith('#'):
            continue
        if line.startswith('--hash='):
            pins[pin].add(line)
        else:
            pin = line
            pins[pin] = set()
    return pins


def check() -> int:
    """0 when each committed lock is what its inputs resolve to today, resolved within its own pins: a changed
    dependency, extra or constraint fails, a release the registry only lists later (some mirrors fill in
    releases after their upload date, which EXCLUDE_NEWER cannot exclude) does not."""
    stale = []
    for name in FLAVOURS:
        committed = LOCKS / f'{name}.txt'
        try:
            made = compile_lock(name, within_committed=True)
        except LockError as error:
            stale.append(f'locks/{name}.txt no longer resolves: {error}')
            continue
        old = pins_and_hashes(committed.read_text()) if committed.exists() else {}
        now = pins_and_hashes(made)
        moved = [f'-{pin}' for pin in old if pin not in now] + [f'+{pin}' for pin in now if pin not in old]
        # a file the registry lists later adds a hash (harmless: the lock allows fewer files); one it no longer
        # lists would make the install fail
        gone = [
            f'{pin}: {len(old[pin] - now[pin])} of its files no longer listed'
            for pin in old
            if pin in now and old[pin] - now[pin]
        ]
        if moved or gone:
            found = moved + gone
            stale.append(f'locks/{name}.txt differs from what deploy/lock.py makes:\n' + '\n'.join(found[:40]))
    if stale:
        print('\n\n'.join(stale) + '\n\nrun: python deploy/lock.py', file=sys.stderr)
        return 1
    print(f'locks/: {len(FLAVOURS)} locks, each what deploy/lock.py makes')
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--check', action='store_true', help='resolve each lock again within its pins and compare')
    if parser.parse_args().check:
        return check()
    try:
        made = make(LOCKS)
    except LockError as error:
        sys.exit(f'deploy/lock.py: {error}')
    print('\n'.join(f'{p.relative_to(ROOT)}: {sum(1 for line in p.open() if line[:1].isalnum())} pins' for p in made))
    return 0


if __name__ == '__main__':
    sys.exit(main())
