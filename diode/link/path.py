"""The path the link's datagrams take: its MTU, and what a datagram larger than it costs.

A datagram larger than the path's MTU crosses as IP fragments, and the kernel drops the whole
datagram when any one fragment is lost: at 1 % frame loss, a 65 000-byte datagram over an MTU of
1500 (44 fragments) is lost 36 % of the time, a 1472-byte one 1 % of the time. So the datagram
size defaults to `auto`: the MTU of the device toward link.host, less the IP and UDP headers
(65 000 at most, as on loopback), and a size the path would fragment is warned about unless
link.allow.fragmentation says it is meant.

The device is the one whose address the kernel would send from toward link.host (a connected
UDP socket's own address, no packet sent): on the sender, the egress device; on the receiver,
where link.host is its own address, the device that holds it. Both sides of one link so agree.
"""

import ipaddress
import math
import socket
from typing import NamedTuple

import psutil

MAX_AUTO = 65000            # the largest `auto` size (loopback's MTU is 65 536)
IPV4_UDP, IPV6_UDP = 28, 48  # IP + UDP header bytes around each datagram
MAX_UDP_PAYLOAD = 65535 - IPV4_UDP    # 65 507: the largest datagram IPv4 carries
ETHERNET_DATAGRAM = 1500 - IPV4_UDP   # 1 472: the largest that crosses an Ethernet frame whole
DATAGRAM_BUFFER = 65536               # bytes of a receive buffer that any datagram fits in


class Path(NamedTuple):
    device: str | None   # None when no device holds the source address (or no route)
    mtu: int | None
    source: str | None   # the local address toward the host

    def unfragmented(self, host: str) -> int | None:
        """The largest datagram that crosses this path whole; None if the MTU is unknown."""
        if self.mtu is None:
            return None
        return min(MAX_AUTO, self.mtu - (IPV6_UDP if _is_v6(host) else IPV4_UDP))


def toward(host: str) -> Path:
    """The path toward `host` as this machine sees it: the device and MTU the kernel would use
    (from a connected UDP socket's source address; nothing is sent)."""
    family = socket.AF_INET6 if _is_v6(host) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            source = s.getsockname()[0]
    except (OSError, TypeError, UnicodeError, ValueError):
        # no route, a name that does not resolve, or not a host name at all: not known here
        return Path(None, None, None)
    source = source.split("%")[0]
    for device, addrs in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == source for a in addrs):
            stats = psutil.net_if_stats().get(device)
            return Path(device, stats.mtu if stats and stats.mtu else None, source)
    return Path(None, None, source)


def fragments(size: int, mtu: int, host: str = "") -> int:
    """How many IP fragments a UDP datagram of `size` payload bytes crosses an MTU as."""
    ip_header = 40 if _is_v6(host) else 20
    if size + 8 + ip_header <= mtu:
        return 1
    per = (mtu - ip_header) // 8 * 8  # every fragment but the last carries a multiple of 8
    return math.ceil((size + 8) / per)


def fragmentation_warning(size: int, path: Path, host: str, frame_loss: float = 0.01) -> str:
    """What a datagram size the path fragments costs, in a sentence (empty when it does not)."""
    whole = path.unfragmented(host)
    if whole is None or size <= whole:
        return ""
    n = fragments(size, path.mtu, host)
    lost = 1 - (1 - frame_loss) ** n
    return (f"link.datagram.size.bytes {size} is larger than the path to {host} carries whole "
            f"(MTU {path.mtu} on {path.device}: {whole} bytes): each datagram crosses as {n} IP "
            f"fragments, and losing any one loses the datagram (at {frame_loss:.0%} frame loss, "
            f"{lost:.0%} of datagrams instead of {frame_loss:.0%}). Set it to auto or {whole}, "
            "or link.allow.fragmentation: true if that is meant")


def fragmentation(link) -> str:
    """A topology's `link` settings: the warning its datagram size earns on the path toward
    link.host from here (empty: none, or allow.fragmentation says it is meant)."""
    if link.allow_fragmentation:
        return ""
    return fragmentation_warning(link.datagram_size_bytes, toward(link.host), link.host)


def _is_v6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return ":" in host
