"""The locks (locks/*.txt, deploy/lock.py): each is what the lock command makes today, pins every distribution
with hashes, keeps constraints.txt's pins and the base lock's versions, and this test environment, installed
by the README's command, holds exactly the test lock's versions. The container images' own check is in
tests/containers/test_images.py."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

import pytest

from .lockfiles import FLAVOURS, LOCKS, ROOT, canonical, linux_environment, pins, read_lock, resolved

PYTHONS = ('3.11.7', '3.12.8', '3.13.5')  # the Linux Pythons the images and the README's machines run


def test_the_lock_command_makes_the_committed_locks():
    """Resolved again from PyPI within its own pins (files published after deploy/lock.py's EXCLUDE_NEWER
    left out), every lock's pins come out as committed and every hash it holds is still listed: a changed pin
    or dependency without a new lock fails here, a release or file the registry lists late does not."""
    result = subprocess.run(
        [sys.executable, 'deploy/lock.py', '--check'], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert f'{len(FLAVOURS)} locks' in result.stdout


def test_the_check_fails_on_a_lock_its_inputs_no_longer_make(tmp_path):
    """In a copy of the tree, a lock missing a dependency and a lock pinned to another version than the one
    its hashes belong to are both named, each with its reason: resolving within the committed pins does not
    hide a stale lock."""
    tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    serve, test = tmp_path / 'locks' / 'serve.txt', tmp_path / 'locks' / 'test.txt'
    dropped = re.sub(r'^wcwidth==.*?(?=^[a-z])', '', serve.read_text(), count=1, flags=re.M | re.S)
    moved = re.sub(r'^(ftfy==)\S+', r'\g<1>6.3.0', test.read_text(), count=1, flags=re.M)
    assert dropped != serve.read_text() and moved != test.read_text(), 'the locks no longer pin wcwidth and ftfy'
    serve.write_text(dropped)
    test.write_text(moved)
    result = subprocess.run(
        [sys.executable, 'deploy/lock.py', '--check'], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert 'locks/serve.txt differs' in result.stderr and '+wcwidth==' in result.stderr
    assert 'locks/test.txt no longer resolves' in result.stderr and 'ftfy' in result.stderr
    assert 'locks/base.txt differs' not in result.stderr


def test_the_lock_folder_holds_one_lock_per_flavour():
    assert sorted(p.stem for p in LOCKS.glob('*.txt')) == sorted(FLAVOURS)
    flavours = re.search(r'^FLAVOURS = \{(.*?)^\}', (ROOT / 'deploy' / 'lock.py').read_text(), re.M | re.S).group(1)
    assert sorted(re.findall(r"^    '([a-z0-9-]+)':", flavours, re.M)) == sorted(FLAVOURS)


@pytest.mark.parametrize('flavour', FLAVOURS)
def test_every_pin_has_hashes_and_keeps_constraints(flavour):
    locked = read_lock((LOCKS / f'{flavour}.txt').read_text())
    assert len(locked) > 50, f'locks/{flavour}.txt reads as {len(locked)} pins'
    unhashed = [p.name for p in locked if not p.hashes or not all(h.startswith('--hash=sha256:') for h in p.hashes)]
    assert unhashed == [], f'locks/{flavour}.txt: pins without sha256 hashes: {unhashed}'
    constraints = pins((ROOT / 'constraints.txt').read_text())
    against = {p.name: (p.version, constraints[p.name]) for p in locked if p.name in constraints}
    wrong = {name: versions for name, versions in against.items() if versions[0] != versions[1]}
    assert wrong == {}, f'locks/{flavour}.txt against constraints.txt (lock, constraint): {wrong}'
    assert 'clipserve' not in {p.name for p in locked}, 'the checkout itself is installed from the tree, not locked'


@pytest.mark.parametrize('python', PYTHONS)
@pytest.mark.parametrize('flavour', [f for f in FLAVOURS if f != 'base'])
def test_each_flavour_installs_the_base_locks_versions(flavour, python):
    """The Dockerfile installs the base lock, then the variant's over it: the shared distributions must not move."""
    environment = linux_environment(python)
    base, variant = resolved('base', environment), resolved(flavour, environment)
    moved = {n: (v, variant.get(n)) for n, v in base.items() if variant.get(n) != v}
    assert moved == {}, f'Python {python}: locks/base.txt -> locks/{flavour}.txt: {moved}'


def test_this_environment_holds_the_test_locks_versions():
    """The README's test command installs locks/test.txt: every distribution it pins for this Python is
    installed at exactly that version (found where pip finds them)."""
    wanted = resolved('test')
    installed = {}
    for dist in metadata.distributions():  # in sys.path's order: the first of a name is the one imported
        installed.setdefault(canonical(dist.metadata['Name']), dist.version)
    wrong = {n: (v, installed.get(n)) for n, v in wanted.items() if installed.get(n) != v}
    assert wrong == {}, f'locks/test.txt pin, installed: {wrong}'
    assert {'clipserve', 'clipserve-client'} <= installed.keys(), 'the checkout itself: pip install --no-deps -e .'
