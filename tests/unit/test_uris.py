import base64
import os
import threading
import time

import pytest

from clipserve.inputs.uris import UriError, UriPolicy, decode_data_uri


def test_data_uris_are_always_allowed():
    payload = b'\x89PNG not really'
    uri = 'data:image/png;base64,' + base64.b64encode(payload).decode()
    assert UriPolicy().load(uri) == payload
    assert decode_data_uri('data:text/plain,hello%20world', 100) == b'hello world'


@pytest.mark.parametrize(
    'uri, reason',
    [
        ('data:image/png;base64', 'no comma'),
        ('data:image/png;base64,@@@@', 'malformed base64'),
    ],
)
def test_malformed_data_uris(uri, reason):
    with pytest.raises(UriError, match=reason):
        UriPolicy().load(uri)


def test_huge_data_uri_is_refused_before_decoding():
    uri = 'data:image/png;base64,' + 'A' * 2_000_000
    with pytest.raises(UriError, match='larger than the limit'):
        UriPolicy(max_bytes=1_000_000).load(uri)


def test_local_files_and_remote_urls_are_off_by_default(tmp_path):
    f = tmp_path / 'x.jpg'
    f.write_bytes(b'abc')
    for uri in (str(f), f'file://{f}'):
        with pytest.raises(UriError, match='allow_local_files'):
            UriPolicy().load(uri)
    with pytest.raises(UriError, match='allow_remote_uris'):
        UriPolicy().load('http://example.com/x.jpg')
    with pytest.raises(UriError, match='unsupported URI scheme'):
        UriPolicy().load('ftp://example.com/x.jpg')


def test_local_files_confined_to_root(tmp_path):
    root = tmp_path / 'images'
    root.mkdir()
    (root / 'ok.jpg').write_bytes(b'ok')
    (tmp_path / 'secret').write_bytes(b'secret')
    os.symlink(tmp_path / 'secret', root / 'link.jpg')
    policy = UriPolicy(allow_local_files=True, local_files_root=str(root))
    assert policy.load(str(root / 'ok.jpg')) == b'ok'
    assert policy.load(f'file://{root}/ok.jpg') == b'ok'
    for escape in (str(root / '..' / 'secret'), str(root / 'link.jpg'), '/etc/passwd'):
        with pytest.raises(UriError, match='outside the directory'):
            policy.load(escape)
    with pytest.raises(UriError, match='no such file'):
        policy.load(str(root / 'missing.jpg'))


@pytest.mark.parametrize(
    'url',
    [
        'http://127.0.0.1:1/x.jpg',
        'http://localhost:1/x.jpg',
        'http://169.254.169.254/latest/meta-data',
        'http://10.0.0.1/x.jpg',
    ],
)
def test_remote_fetches_refuse_non_public_addresses(url):
    with pytest.raises(UriError, match='non-public address'):
        UriPolicy(allow_remote=True).load(url)


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32): the server's IPv4 address, then the client's with every bit flipped."""
    import ipaddress

    server_bits, client_bits = int(ipaddress.IPv4Address(server)), int(ipaddress.IPv4Address(client))
    value = (0x20010000 << 96) | (server_bits << 64) | (~client_bits & 0xFFFFFFFF)
    return str(ipaddress.IPv6Address(value))


@pytest.mark.parametrize(
    'ip, reason',
    [
        # public
        ('8.8.8.8', None),
        ('1.1.1.1', None),
        ('2606:4700:4700::1111', None),
        ('::ffff:8.8.8.8', None),
        ('64:ff9b::808:808', None),
        ('2002:808:808::1', None),
        # plain IPv4
        ('127.0.0.1', 'loopback'),
        ('127.255.255.254', 'loopback'),
        ('10.1.2.3', 'private'),
        ('172.16.0.1', 'private'),
        ('192.168.1.1', 'private'),
        ('169.254.169.254', 'link-local'),
        ('0.0.0.0', 'unspecified'),
        ('224.0.0.1', 'multicast'),
        ('239.1.1.1', 'multicast'),
        ('240.0.0.1', ''),
        ('100.64.0.1', 'not globally'),
        ('255.255.255.255', ''),
        # plain IPv6
        ('::1', 'loopback'),
        ('::', 'unspecified'),
        ('fe80::1', 'link-local'),
        ('fe80::1%eth0', 'link-local'),
        ('fc00::1', 'unique-local'),
        ('fd12:3456::1', 'unique-local'),
        ('fec0::1', 'site-local'),
        ('ff02::1', 'multicast'),
        ('ff0e::1', 'multicast'),
        ('2001:db8::1', ''),
        ('100::1', ''),
        # IPv4-mapped: the IPv4 address decides
        ('::ffff:127.0.0.1', 'IPv4-mapped form of the loopback address 127.0.0.1'),
        ('::ffff:169.254.169.254', 'IPv4-mapped form of the link-local address 169.254.169.254'),
        # IPv4-compatible (deprecated): refused, naming the IPv4 address when that is not public
        ('::127.0.0.1', 'IPv4-compatible form of the loopback address 127.0.0.1'),
        ('::10.0.0.1', 'IPv4-compatible form of the private address 10.0.0.1'),
        ('::8.8.8.8', 'reserved'),
        # NAT64, well-known prefix (the last 32 bits) and local-use prefix (refused whole)
        ('64:ff9b::7f00:1', 'NAT64 form of the loopback address 127.0.0.1'),
        ('64:ff9b::a9fe:a9fe', 'NAT64 form of the link-local address 169.254.169.254'),
        ('64:ff9b::a00:1', 'NAT64 form of the private address 10.0.0.1'),
        ('64:ff9b:1::808:808', 'local-use NAT64'),
        ('64:ff9b:1::7f00:1', 'local-use NAT64'),
        # 6to4 (bits 16-48)
        ('2002:7f00:1::', '6to4 form of the loopback address 127.0.0.1'),
        ('2002:a9fe:a9fe::', '6to4 form of the link-local address 169.254.169.254'),
        ('2002:c0a8:101::1', '6to4 form of the private address 192.168.1.1'),
        # Teredo: the server (bits 32-64) and the obfuscated client (last 32 bits); 2001::/23 is not public anyway
        (teredo('127.0.0.1', '8.8.8.8'), 'Teredo server form of the loopback address 127.0.0.1'),
        (teredo('8.8.8.8', '10.0.0.1'), 'Teredo client form of the private address 10.0.0.1'),
        (teredo('8.8.8.8', '8.8.4.4'), ''),
    ],
)
def test_non_public_reason(ip, reason):
    """reason: None for public, else a part of the reason ('' where only refusal matters: labels vary by Python)."""
    from clipserve.inputs.addresses import non_public_reason

    got = non_public_reason(ip)
    assert got == reason if reason is None else (got is not None and reason in got), got


def test_malformed_allow_list_networks_fail_at_construction():
    with pytest.raises(ValueError, match='10.0.0.0/33'):
        UriPolicy(allow_remote=True, allowed_hosts=('10.0.0.0/33',))
    UriPolicy(allow_remote=True, allowed_hosts=('images.example.com', '10.0.0.5', '10.1.0.0/16', '[::1]', ''))


def unblock_fifo_reader(path):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # fails (ENXIO) until someone opened it to read
        except OSError:
            time.sleep(0.05)


@pytest.mark.parametrize('special', ['/dev/zero', '/dev/null', 'fifo', 'directory'])
def test_only_regular_files_are_read(tmp_path, special):
    if special == 'fifo':
        special = str(tmp_path / 'fifo')
        os.mkfifo(special)  # opening it would block until a writer came: it must be refused before opening
        threading.Thread(target=unblock_fifo_reader, args=(special,), daemon=True).start()  # no hang if it is not
    elif special == 'directory':
        special = str(tmp_path)
    with pytest.raises(UriError, match='not a regular file'):
        UriPolicy(allow_local_files=True).load(special)


def test_proc_files_that_report_size_zero_are_still_capped():
    """/proc files have st_size 0 whatever their length: the read itself must be bounded."""
    policy = UriPolicy(allow_local_files=True, local_files_root='/proc', max_bytes=16)
    assert os.stat('/proc/self/maps').st_size == 0
    with pytest.raises(UriError, match='larger than the limit of 16 bytes'):
        policy.load('/proc/self/maps')


def test_file_size_cap(tmp_path):
    f = tmp_path / 'x.jpg'
    f.write_bytes(b'x' * 100)
    assert UriPolicy(allow_local_files=True, max_bytes=100).load(str(f)) == b'x' * 100
    with pytest.raises(UriError, match='larger than the limit of 99 bytes'):
        UriPolicy(allow_local_files=True, max_bytes=99).load(str(f))


def test_unreadable_files_are_refused_with_a_message(tmp_path):
    if os.geteuid() == 0:
        pytest.skip('root reads any file')
    f = tmp_path / 'x.jpg'
    f.write_bytes(b'x')
    f.chmod(0)
    with pytest.raises(UriError, match='cannot read the file on the server: Permission denied'):
        UriPolicy(allow_local_files=True).load(str(f))
