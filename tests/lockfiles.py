"""Reading locks/*.txt (made by deploy/lock.py) as pip would on a given Python: which version of each
distribution an install from the lock holds; and constraints.txt's pins."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / 'locks'
FLAVOURS = ('base', 'serve', 'test', 'cpu-onnx', 'cpu-openvino', 'cuda')


def canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def pins(constraints: str) -> dict[str, str]:
    """name -> version of each `name==version` line of a constraints file's text."""
    lines = [line.split('#')[0].strip() for line in constraints.splitlines()]
    return {canonical(n): v for n, _, v in (line.partition('==') for line in lines if '==' in line)}


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: str
    hashes: tuple[str, ...]


def read_lock(text: str) -> list[Pin]:
    """Every requirement of a lock: `name==version [; marker]` and its `--hash=` lines."""
    pins = []
    for entry in re.split(r'\n(?=[A-Za-z0-9])', text):
        lines = [line.split('#')[0].strip() for line in entry.splitlines()]
        joined = ' '.join(line.rstrip('\\').strip() for line in lines if line)
        if not joined:
            continue
        match = re.fullmatch(r'([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;\s*(.*?))?((?:\s+--hash=\S+)*)', joined)
        assert match, f'not a pinned requirement with hashes: {joined[:200]}'
        name, version, marker, hashes = match.groups()
        pins.append(Pin(canonical(name), version, (marker or '').strip(), tuple(hashes.split())))
    return pins


def linux_environment(python: str) -> dict[str, str]:
    """Marker values of CPython `python` (e.g. '3.13.5') on x86-64 Linux."""
    return {
        'implementation_name': 'cpython',
        'os_name': 'posix',
        'platform_machine': 'x86_64',
        'platform_python_implementation': 'CPython',
        'platform_system': 'Linux',
        'python_full_version': python,
        'python_version': '.'.join(python.split('.')[:2]),
        'sys_platform': 'linux',
    }


def resolve(text: str, environment: dict[str, str] | None = None) -> dict[str, str]:
    """name -> version that `pip install --no-deps -r LOCK` installs from the lock `text` where `environment`
    (default: this interpreter's) holds."""
    chosen: dict[str, str] = {}
    for pin in read_lock(text):
        if pin.marker and not Marker(pin.marker).evaluate(environment):
            continue
        assert pin.name not in chosen, f'two versions of {pin.name} apply at once'
        chosen[pin.name] = pin.version
    return chosen


def resolved(flavour: str, environment: dict[str, str] | None = None) -> dict[str, str]:
    """resolve() of locks/FLAVOUR.txt."""
    return resolve((LOCKS / f'{flavour}.txt').read_text(), environment)
