"""Only the gateway listens beyond loopback: an executor's own port, which answers Jina's RPC without the
gateway's token, must not be reachable from another machine.

Read from the kernel's socket tables (/proc/net/tcp, tcp6) for the Flow's processes, so no traffic
leaves loopback.
"""

import ipaddress
import os
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, TINY, flow_from_yaml, free_port, set_port

LISTEN = '0A'


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f'/proc/{pid}/fd').iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # IPv6 is four little-endian 32-bit words
    return ipaddress.IPv6Address(b''.join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening(pids: set[int]) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, int]]:
    """(address, port, pid) of every listening TCP socket the processes `pids` hold."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and inode in owner:
                host, port = local.split(':')
                found.append((_address(host), int(port, 16), owner[inode]))
    return found


def descendants(pid: int) -> set[int]:
    children = {}
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _is_loopback(address) -> bool:
    mapped = getattr(address, 'ipv4_mapped', None)
    return (mapped or address).is_loopback


def test_every_shipped_flow_keeps_its_executors_on_loopback():
    for path in sorted((ROOT / 'flows').glob('*.yml')):
        for executor in yaml.safe_load(path.read_text())['executors']:
            assert executor.get('host') == '127.0.0.1', f'{path.name}: executor {executor["name"]} listens beyond loopback'


@pytest.mark.parametrize('flow_name, edit', [
    ('shards.yml', lambda c: c['executors'][0].update(replicas=2)),  # a head, two shards of two replicas
    ('auth.yml', None),
])
def test_only_the_gateway_listens_beyond_loopback(flow_name, edit, tmp_path, monkeypatch):
    config = yaml.safe_load((ROOT / 'flows' / flow_name).read_text())
    gateway_ports = [free_port() for _ in range(len(config.get('gateway', {}).get('protocol', [0])))]

    def change(c):
        set_port(c, gateway_ports if len(gateway_ports) > 1 else gateway_ports[0])
        if edit:
            edit(c)

    monkeypatch.setenv('CLIPSERVE_AUTH_TOKEN', 'a-token')
    flow = flow_from_yaml(flow_name, tmp_path, change, {'CLIPSERVE_MODEL': TINY})
    # other tests' Flows may still run as our children: judge only the processes this Flow starts
    already_running = descendants(os.getpid())
    with flow:
        sockets = listening(descendants(os.getpid()) - already_running)
    beyond = [(str(a), port) for a, port, _ in sockets if not _is_loopback(a)]
    on_loopback = [port for a, port, _ in sockets if _is_loopback(a)]
    assert sorted(port for _, port in beyond) == sorted(gateway_ports), (beyond, gateway_ports)
    # the executors (and the head of a sharded one) are there, on loopback
    expected_runtimes = 5 if flow_name == 'shards.yml' else 1
    assert len(on_loopback) >= expected_runtimes, sockets
