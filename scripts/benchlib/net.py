"""What the kernel says about UDP sockets on 127.0.0.1 (Linux /proc files; None or -1 elsewhere)."""

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


def udp_socket(port: int) -> dict | None:
    """The socket bound to 127.0.0.1:`port` as /proc/net/udp shows it: `rx_queue`, the bytes
    waiting in its receive buffer (as the kernel charges them, overhead included), and `drops`,
    the datagrams discarded because that buffer was full. None while nothing is bound there."""
    from diode.link import udpstat
    want = f"0100007F:{port:04X}"
    return next(({"rx_queue": s["rx_queue"], "drops": s["drops"]} for s in udpstat.sockets()
                 if s["local"] == want), None)


def udp_socket_drops(port: int) -> int | None:
    s = udp_socket(port)
    return None if s is None else s["drops"]
