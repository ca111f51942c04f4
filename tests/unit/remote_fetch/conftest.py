"""Two autouse fixtures keep all traffic of these tests on this machine: a resolver that answers only the
test's names and numeric addresses (no DNS query ever leaves), and a guard on socket.connect that fails
the test on any connection attempt to an address outside loopback."""

import ipaddress
import socket

import pytest

from .servers import Forbidden, Server, standard


@pytest.fixture
def server():
    s = Server(standard)
    yield s
    s.close()


@pytest.fixture(autouse=True)
def connections(monkeypatch):
    """Every address the code under test connects to; anything outside loopback fails the test."""
    attempts = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if isinstance(address, tuple):  # an IP socket (a Unix socket's address is a path)
            attempts.append(address[0])
            if not ipaddress.ip_address(str(address[0]).split('%')[0]).is_loopback:
                raise Forbidden(f'the code under test tried to connect to {address[0]}, outside loopback')

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, 'connect', connect)
    monkeypatch.setattr(socket.socket, 'connect_ex', connect_ex)
    return attempts


@pytest.fixture(autouse=True)
def dns(monkeypatch):
    """A resolver for names ending in .test: dns[name] = [first answer, second answer, ...], the last repeating.

    Numeric hosts and localhost are resolved for real (no query leaves the machine); other names fail.
    """
    answers, real = {}, socket.getaddrinfo

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        host = host.decode() if isinstance(host, bytes) else host
        port = int(port or 0)
        if host in answers:
            addresses = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
            return [
                (
                    socket.AF_INET6 if ':' in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    '',
                    (a, port, 0, 0) if ':' in a else (a, port),
                )
                for a in addresses
            ]
        if host == 'localhost':
            return real(host, port, family, type, proto, flags)
        try:
            return real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)
        except socket.gaierror:
            raise socket.gaierror(socket.EAI_NONAME, f'test resolver: unknown name {host!r}') from None

    monkeypatch.setattr(socket, 'getaddrinfo', getaddrinfo)
    return answers
