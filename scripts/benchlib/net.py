"""What the kernel says about UDP sockets (Linux /proc files; None or -1 elsewhere): on
127.0.0.1, or on the test bed's receiving host (an address there, and a process that runs there
to see its network namespace through)."""

import socket
from pathlib import Path


def rmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/core/rmem_max").read_text())
    except (OSError, ValueError):
        return 0


def udp_rcvbuf_errors() -> int:
    """Datagrams the kernel dropped because a socket's receive buffer was full (all sockets)."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()
                 if line.startswith("Udp:")]
        return int(lines[1][lines[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return -1


def udp_socket(port: int, host: str = "127.0.0.1", pid: int | None = None) -> dict | None:
    """The sockets bound to `host`:`port` as /proc/net/udp shows them (that of `pid`'s network
    namespace with a pid), summed: `rx_queue`, the bytes waiting in their receive buffers (as
    the kernel charges them, overhead included), and `drops`, the datagrams discarded because a
    buffer was full (or a source filter refused them). A receiver with link.source.addresses
    holds two: the one it reads, and the one that counts what its filter drops
    (diode.link.admission). None while nothing is bound there."""
    from diode.link import udpstat
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    found = [s for s in udpstat.sockets(pid) if s["local"] == want]
    if not found:
        return None
    return {"rx_queue": sum(s["rx_queue"] for s in found),
            "drops": sum(s["drops"] for s in found)}


def udp_socket_drops(port: int, host: str = "127.0.0.1", pid: int | None = None) -> int | None:
    s = udp_socket(port, host, pid)
    return None if s is None else s["drops"]
