"""Which addresses a remote fetch may connect to: public ones, in any spelling (IPv6 forms that carry an
IPv4 address are judged by that address), or those the operator allow-lists by name, address or network."""

from __future__ import annotations

import ipaddress

from clipserve.inputs.data_uris import UriError

_NAT64 = ipaddress.ip_network('64:ff9b::/96')  # RFC 6052: the IPv4 address is the last 32 bits
_NAT64_LOCAL = ipaddress.ip_network('64:ff9b:1::/48')  # RFC 8215: local-use NAT64, never public
_IPV4_COMPATIBLE = ipaddress.ip_network('::/96')  # deprecated ::a.b.c.d
_UNIQUE_LOCAL = ipaddress.ip_network('fc00::/7')
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def non_public_reason(ip: str | _IPAddress) -> str | None:
    """Why `ip` is not a public address (e.g. 'loopback'), or None when it is public.

    IPv6 forms that carry an IPv4 address are judged by that address: IPv4-mapped and NAT64
    (64:ff9b::/96) are how IPv4 is reached over IPv6, so the IPv4 address decides; for 6to4, Teredo and
    the deprecated IPv4-compatible form a non-public IPv4 address inside refuses the address too.
    """
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip.split('%')[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _embedded_reason('IPv4-mapped', ip.ipv4_mapped)
        if ip in _NAT64:
            return _embedded_reason('NAT64', ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip in _NAT64_LOCAL:
            return 'local-use NAT64 prefix 64:ff9b:1::/48'
        embedded = []
        if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 are judged as themselves
            embedded.append(('IPv4-compatible', ipaddress.IPv4Address(int(ip))))
        if ip.sixtofour is not None:
            embedded.append(('6to4', ip.sixtofour))
        if ip.teredo is not None:
            embedded += [('Teredo server', ip.teredo[0]), ('Teredo client', ip.teredo[1])]
        for form, ipv4 in embedded:
            reason = _embedded_reason(form, ipv4)
            if reason is not None:
                return reason
    return _plain_reason(ip)


def _embedded_reason(form: str, ipv4: ipaddress.IPv4Address) -> str | None:
    reason = _plain_reason(ipv4)
    return None if reason is None else f'{form} form of the {reason} address {ipv4}'


def _plain_reason(ip: _IPAddress) -> str | None:
    if ip.is_unspecified:
        return 'unspecified'
    if ip.is_loopback:
        return 'loopback'
    if ip.is_link_local:
        return 'link-local'
    if ip.is_multicast:
        return 'multicast'
    if isinstance(ip, ipaddress.IPv6Address) and ip in _UNIQUE_LOCAL:
        return 'unique-local'
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return 'site-local'
    if ip.is_private:
        return 'private'
    if ip.is_reserved:
        return 'reserved'
    if not ip.is_global:
        return 'not globally routable'
    return None


def parse_allowed_hosts(entries: tuple[str, ...]) -> tuple[frozenset[str], tuple]:
    """(host names, networks): an entry that parses as an address or CIDR network is a network."""
    names, networks = set(), []
    for entry in entries:
        entry = str(entry).strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip('[]'), strict=False))
        except ValueError:
            if '/' in entry:
                raise ValueError(f'remote_allowed_hosts: {entry!r} is not a valid address or network') from None
            names.add(ascii_host(entry).rstrip('.'))
    return frozenset(names), tuple(networks)


def ascii_host(host: str) -> str:
    """The host name as sent to the resolver and in the Host header (IDNA for non-ASCII names), lower case."""
    if not host:
        raise UriError('the URL has no host')
    try:
        return (host if host.isascii() else host.encode('idna').decode('ascii')).lower()
    except UnicodeError:
        raise UriError(f'invalid host name {host!r}') from None


def check_addresses(host: str, addresses: list[str], allowed_hosts: tuple[str, ...]) -> None:
    """Refuse unless every address `host` resolved to is public, in an allowed network, or the name allowed."""
    names, networks = parse_allowed_hosts(allowed_hosts)
    if host.rstrip('.') in names:
        return
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.split('%')[0])
        except ValueError:
            raise UriError(f'host {host!r} resolves to {address!r}, which is not an IP address') from None
        if any(ip in network for network in networks):
            continue
        reason = non_public_reason(ip)
        if reason is not None:
            raise UriError(
                f'host {host!r} resolves to the non-public address {ip} ({reason}); the server refuses to '
                'fetch it (the operator can allow-list it with remote_allowed_hosts)'
            )
