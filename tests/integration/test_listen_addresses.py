"""Only the gateway listens beyond loopback: an executor's own port, which answers Jina's RPC without the
gateway's token, must not be reachable from another machine.

Read from the kernel's socket tables (/proc/net/tcp, tcp6) for the Flow's processes, so no traffic
leaves loopback.
"""

import os
import socket

import pytest
import yaml

from devkit.procfs import descendants, listening

from .conftest import ROOT, TINY, flow_from_yaml, free_port, set_port


def _own_address() -> str | None:
    """This machine's address on its default route (a UDP connect sends nothing), None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(('192.0.2.1', 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith('127.') else address


def _is_loopback(address) -> bool:
    mapped = getattr(address, 'ipv4_mapped', None)
    return (mapped or address).is_loopback


def test_every_shipped_flow_keeps_its_executors_on_loopback():
    for path in sorted((ROOT / 'flows').glob('*.yml')):
        for executor in yaml.safe_load(path.read_text())['executors']:
            assert executor.get('host') == '127.0.0.1', (
                f'{path.name}: executor {executor["name"]} listens beyond loopback'
            )


@pytest.mark.parametrize(
    'flow_name, edit',
    [
        ('shards.yml', lambda c: c['executors'][0].update(replicas=2)),  # a head, two shards of two replicas
        ('auth.yml', None),
    ],
)
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
        # a client that tries an executor's port on the machine's own address is refused,
        # while the gateway answers there
        own = _own_address()
        if own is not None:
            for port in on_loopback:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((own, port), timeout=5).close()
            for port in gateway_ports:
                socket.create_connection((own, port), timeout=5).close()
