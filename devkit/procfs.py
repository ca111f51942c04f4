"""What the kernel says about our processes' TCP sockets (Linux /proc), so tests can prove where
traffic is without sending any."""

import ipaddress
import os
from pathlib import Path

LISTEN = '0A'
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f'/proc/{pid}/fd').iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # IPv6 is four little-endian 32-bit words
    return ipaddress.IPv6Address(b''.join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def _rows():
    """(local address, port, state, receive queue bytes, inode) of every TCP socket on the machine."""
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            host, port = fields[1].split(':')
            rx_queue = int(fields[4].split(':')[1], 16)
            yield _address(host), int(port, 16), fields[3], rx_queue, fields[9]


def listening(pids: set[int]) -> list[tuple[Address, int, int]]:
    """(address, port, pid) of every listening TCP socket the processes `pids` hold."""
    owner = {inode: pid for pid in pids for inode in socket_inodes(pid)}
    return [
        (address, port, owner[inode])
        for address, port, state, _, inode in _rows()
        if state == LISTEN and inode in owner
    ]


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


# ---- memory ---------------------------------------------------------------------------------------


def status_mib(pid: int, field: str = 'VmRSS') -> float:
    """A memory figure of /proc/<pid>/status (VmRSS: resident now; VmHWM: the peak since start or since
    `reset_peak`), in MiB."""
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith(field + ':'):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak(pid: int) -> float:
    """Make VmHWM start again from the resident size now (Linux >= 4.0); returns that size in MiB."""
    Path(f'/proc/{pid}/clear_refs').write_text('5')
    return status_mib(pid, 'VmRSS')


def pid_listening_on(port: int, within: int | None = None) -> int:
    """The process among `within`'s descendants (default: this process's) that listens on TCP `port`."""
    pids = descendants(os.getpid() if within is None else within)
    found = {pid for _, listened, pid in listening(pids) if listened == port}
    if len(found) != 1:
        raise LookupError(f'{len(found)} processes listen on port {port}: {sorted(found)}')
    return found.pop()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) `pid` has used so far."""
    fields = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
