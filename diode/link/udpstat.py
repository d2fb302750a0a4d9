"""What the kernel says of a UDP socket (Linux /proc/net/udp and udp6): the bytes waiting in its
receive buffer and the datagrams it dropped: because that buffer was full, or because its
socket filter refused them (the kernel counts both alike: diode.link.admission keeps them
apart). Nothing else tells a diode receiver that it lost datagrams to its own slowness."""

import os
from pathlib import Path


def sockets(pid: int | None = None):
    """Every UDP socket: {"local": "0100007F:0D80", "inode": int, "rx_queue": bytes,
    "drops": datagrams}; nothing where /proc cannot be read. `pid`: those of the network
    namespace of that process (another host on the test bed), not this one's."""
    where = f"/proc/{pid}/net" if pid else "/proc/net"
    for name in ("udp", "udp6"):
        try:
            lines = Path(f"{where}/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            try:
                yield {"local": f[1], "inode": int(f[9]), "rx_queue": int(f[4].split(":")[1], 16),
                       "drops": int(f[-1])}
            except (IndexError, ValueError):
                continue


def of(*socks) -> tuple:
    """Each socket's entry (by its inode), None for one the kernel does not show (or None)."""
    inodes = [os.fstat(s.fileno()).st_ino if s is not None else None for s in socks]
    found = {s["inode"]: s for s in sockets() if s["inode"] in inodes}
    return tuple(found.get(inode) for inode in inodes)
