"""What reaches the receiver's UDP socket: the address it binds, and the senders it admits.

Anyone on the low network can send to the receiver's port (docs/threat-model.md). Nothing they
send is written (every datagram is authenticated), but every datagram the socket queues takes
room in its receive buffer and a turn of the udp_reader: a flood of them crowds the diode's own
datagrams out of the buffer, and the kernel drops those (49 % of the records arrived under a
flood of 790 000 datagrams a second from one process on loopback; docs/threat-model.md). So:

- **The bind address** (`link.bind.address: auto`, the default): link.host where that is an
  address of this host (the address the diode delivers to), so the port is not open on the
  host's other networks; every address (0.0.0.0) only when written, or when link.host is not
  this host's (a diode that delivers to another address than the sender sends to), with a
  warning.
- **The source filter** (`link.source.addresses`: the addresses the diode's datagrams come
  from): a classic BPF program on the receiving socket (SO_ATTACH_FILTER) drops a datagram from
  any other address in the kernel, before it is queued: it takes no room in the buffer and the
  reader never sees it. The program loads the IPv4 source address from the network header
  (SKF_NET_OFF + 12; for a UDP socket the program's own offset 0 is the UDP header), so IPv4
  only: a topology that binds an IPv6 address with a filter is refused.
- **Its count** (`diode_source_filtered_datagrams_total`): the kernel counts a datagram a
  socket filter drops in the socket's drop counter, together with those a full buffer drops,
  and nothing tells the two apart. So the receiving socket joins a SO_REUSEPORT group with a second socket
  of its own, and a reuseport program (SO_ATTACH_REUSEPORT_CBPF, the same test) hands every
  datagram from an address not admitted to that second socket, whose filter drops everything:
  its drop counter is exactly the datagrams filtered (a batch the NIC coalesced, GRO, counts
  once), and the receiving socket's own counter stays what a full buffer dropped
  (`diode_socket_drops_total`). The receiving socket keeps its filter, should the group's
  program ever not run. A probe bound without SO_REUSEPORT first keeps the port's old guard:
  a second receiver on the same port is refused, not let into the group.
- **Where the kernel refuses a filter**, the udp_reader drops datagrams from other addresses
  itself, before it looks at anything in them, and counts them in the same metric (a flood then
  still costs the reader its reads: say so in the log).
"""

import ctypes
import errno
import ipaddress
import socket
import struct
from typing import NamedTuple

import psutil

from diode.errors import DiodeError
from diode.link import offload

SO_ATTACH_FILTER = 26             # SOL_SOCKET options (asm-generic/socket.h)
SO_ATTACH_REUSEPORT_CBPF = 51
SKF_NET_OFF = -0x100000           # a load relative to the network header (linux/filter.h)
IPV4_SOURCE = 12                  # the source address's offset in the IPv4 header
MAX_NETWORKS = 64                 # (a jump of a classic BPF program reaches 255 instructions)

# classic BPF opcodes (linux/bpf_common.h)
LD_W_ABS = 0x00 | 0x00 | 0x20     # A = the 32-bit word at k
TAX, TXA = 0x07, 0x87             # X = A, A = X
AND_K = 0x04 | 0x50 | 0x00        # A &= k
JEQ_K = 0x05 | 0x10 | 0x00        # A == k ? jt : jf
RET_K = 0x06 | 0x00               # accept k bytes (0: drop)
WHOLE = 0xFFFFFFFF                # a filter's "keep the whole datagram"

KERNEL, READER, NONE = 2, 1, 0    # where datagrams are filtered (diode_source_filter)


class Instruction(NamedTuple):
    code: int
    jt: int
    jf: int
    k: int


# -- the setting ---------------------------------------------------------------------------------

def networks(addresses: list) -> list[ipaddress.IPv4Network]:
    """link.source.addresses as networks (an address alone is a /32). Raises ValueError saying
    what is wrong with the first entry that is not an IPv4 address or block."""
    out = []
    for entry in addresses:
        if not isinstance(entry, str):
            raise ValueError(f"{entry!r} is not an address: give it as a string")
        try:
            net = ipaddress.ip_network(entry.strip(), strict=True)
        except ValueError as exc:
            hint = ""
            if "has host bits set" in str(exc):
                hint = f" (the block is {ipaddress.ip_network(entry.strip(), strict=False)})"
            raise ValueError(f"{entry!r} is not an IPv4 address or CIDR block: {exc}{hint}") \
                from None
        if net.version != 4:
            raise ValueError(f"{entry!r} is IPv6: the source filter takes IPv4 senders only "
                             "(filter IPv6 in the firewall, docs/threat-model.md)")
        out.append(net)
    if len(out) > MAX_NETWORKS:
        raise ValueError(f"{len(out)} entries: at most {MAX_NETWORKS} (give CIDR blocks)")
    return out


def problems(addresses: list) -> str | None:
    """The setting's validator: what is wrong with it, or None."""
    try:
        networks(addresses)
    except ValueError as exc:
        return str(exc)
    return None


def describe(nets: list) -> str:
    return ", ".join(str(n.network_address) if n.prefixlen == 32 else str(n) for n in nets)


# -- the bind address ----------------------------------------------------------------------------

def local_address(host: str) -> str | None:
    """The address `host` names when it is one of this host's (so a socket can be bound to it
    and datagrams to it arrive here), else None. Loopback addresses (127.0.0.0/8, ::1) are this
    host's; any other must be on one of its devices (a bind alone would also take a foreign one
    where net.ipv4.ip_nonlocal_bind is set)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError, ValueError):
        return None
    held = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    for family, _, _, _, sockaddr in infos:
        address = sockaddr[0]
        if not (ipaddress.ip_address(address).is_loopback or address in held):
            continue
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.bind((address, 0))
        except OSError:
            continue
        return address
    return None


def bind_address(host: str, asked: str) -> tuple[str, str]:
    """(the address the receiver binds, how `auto` chose it; "" when it was written)."""
    if asked != "auto":
        return asked, ""
    address = local_address(host)
    if address is not None:
        return address, "auto: link.host, an address of this host"
    return "0.0.0.0", (f"auto: link.host {host} is not an address of this host, so every "
                       "address (0.0.0.0); set link.bind.address to the address the diode's "
                       "datagrams come to")


def unfiltered(address: str, port: int) -> str:
    """The warning of an empty link.source.addresses: what it leaves open."""
    return (f"link.source.addresses is empty: any host that reaches udp {address}:{port} is "
            "read, and a flood of datagrams from the low network crowds out the diode's own; "
            "name the diode's sending address there and filter the port in the firewall "
            "(docs/threat-model.md)")


def every_address(address: str) -> bool:
    return address in ("0.0.0.0", "::", "")


# -- the programs ----------------------------------------------------------------------------------

def program(nets: list, admit: int, refuse: int) -> list[Instruction]:
    """A classic BPF program returning `admit` for a datagram whose IPv4 source is in one of
    `nets`, `refuse` for any other: A = source; X = A; per network: A = X & mask, equal to the
    network: admit."""
    body = [Instruction(LD_W_ABS, 0, 0, SKF_NET_OFF + IPV4_SOURCE), Instruction(TAX, 0, 0, 0)]
    last = 2 + 3 * len(nets) + 1  # the index of `ret admit`
    for net in nets:
        jeq = len(body) + 2
        body += [Instruction(TXA, 0, 0, 0),
                 Instruction(AND_K, 0, 0, int(net.netmask)),
                 Instruction(JEQ_K, last - jeq - 1, 0, int(net.network_address))]
    return body + [Instruction(RET_K, 0, 0, refuse), Instruction(RET_K, 0, 0, admit)]


DROP_ALL = [Instruction(RET_K, 0, 0, 0)]


def attach(sock: socket.socket, option: int, prog: list[Instruction]) -> None:
    """Attach a classic BPF program (struct sock_fprog: a count and a pointer to the
    instructions, which the kernel copies)."""
    code = ctypes.create_string_buffer(b"".join(
        struct.pack("HBBI", i.code, i.jt, i.jf, i.k & 0xFFFFFFFF) for i in prog))
    fprog = struct.pack("HL", len(prog), ctypes.addressof(code))
    sock.setsockopt(socket.SOL_SOCKET, option, fprog)


# -- the receiving sockets -------------------------------------------------------------------------

class Receiving:
    """The receiver's socket, the counting socket beside it (None without one), and where
    datagrams from addresses not admitted are dropped: KERNEL, READER (`admits` checks each
    source) or NONE (no filter). Made in the supervisor, before any fork: it outlives a killed
    udp_reader, whose next incarnation inherits it."""

    def __init__(self, sock, counter, where: int, nets: list, notes: list):
        self.sock, self.counter, self.where = sock, counter, where
        self.notes = notes  # (level, message): what the log says once, at start
        self._ranges = [(int(n.network_address), int(n.netmask)) for n in nets]

    def admits(self, source: str) -> bool:
        """The reader's check of a datagram's source address (where the kernel filters
        nothing)."""
        try:
            a = struct.unpack("!I", socket.inet_aton(source))[0]
        except OSError:
            return False
        return any(a & mask == net for net, mask in self._ranges)

    def close(self) -> None:
        self.sock.close()
        if self.counter is not None:
            self.counter.close()


def open_receiving(address: str, port: int, rcvbuf: int, addresses: list,
                   gro: bool = False) -> Receiving:
    """The receiver's socket bound to `address`:`port` with as large a buffer as the kernel
    grants up to `rcvbuf`, filtered by `addresses` (link.source.addresses) as the module says.
    `gro`: the counting socket takes GRO as the receiving socket will (a NIC's GRO asks one
    socket of the group, by hash, whether to coalesce a flow, and must get the same answer)."""
    nets = networks(addresses)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    notes = []
    if not nets:
        notes.append(("warning", unfiltered(address, port)))
        return Receiving(_bound(family, address, port, rcvbuf), None, NONE, nets, notes)
    if family != socket.AF_INET:
        raise DiodeError(f"link.source.addresses filters IPv4 senders, and link.bind.address "
                         f"{address} is IPv6")
    _probe(family, address, port)  # (a second receiver is refused, not let into the group)
    sock = _bound(family, address, port, rcvbuf, reuseport=True)
    try:
        attach(sock, SO_ATTACH_FILTER, program(nets, WHOLE, 0))
    except OSError as exc:
        sock.close()
        sock = _bound(family, address, port, rcvbuf)
        notes.append(("warning", (f"the kernel refused a socket filter ({exc.strerror}): the "
                                  "udp_reader drops datagrams from addresses other than "
                                  f"{describe(nets)} itself, before anything else reads them, "
                                  "but reads them: a flood still costs its time")))
        return Receiving(sock, None, READER, nets, notes)
    counter, why = _counting(family, address, port, sock, nets, gro)
    if counter is None:
        notes.append(("warning", ("the kernel filters datagrams from addresses other than "
                                  f"{describe(nets)}, but cannot count them apart ({why}): "
                                  "diode_socket_drops_total counts them with those a full "
                                  "buffer drops")))
    else:
        notes.append(("info", (f"admitting datagrams from {describe(nets)} alone "
                               "(link.source.addresses), filtered in the kernel")))
    return Receiving(sock, counter, KERNEL, nets, notes)


def _bound(family, address: str, port: int, rcvbuf: int, reuseport=False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise bind_error(address, port, exc) from None
    return sock


def bind_error(address: str, port: int, exc: OSError) -> DiodeError:
    hint = {errno.EADDRINUSE: "; is another receiver running?",
            errno.EADDRNOTAVAIL: " (not an address of this host)"}.get(exc.errno, "")
    return DiodeError(f"cannot bind udp {address}:{port} (link.bind.address, link.port): "
                      f"{exc.strerror}{hint}")


def _probe(family, address: str, port: int) -> None:
    """The port bound for a moment without SO_REUSEPORT: refused while anything holds it."""
    _bound(family, address, port, 4096).close()


def _counting(family, address, port, sock, nets, gro: bool):
    """(the counting socket, "") beside `sock`, or (None, why not)."""
    counter = socket.socket(family, socket.SOCK_DGRAM)
    try:
        # The group's sockets by the order they joined: 0 the receiving socket, 1 this one.
        # Steered before this one joins (an index the group does not have yet falls back to
        # the receiving socket), and dropping everything before it can take a datagram: none
        # of the diode's is ever dropped here.
        attach(sock, SO_ATTACH_REUSEPORT_CBPF, program(nets, 0, 1))
        counter.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        counter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if gro:
            offload.enable_gro(counter)
        attach(counter, SO_ATTACH_FILTER, DROP_ALL)
        counter.bind((address, port))
    except OSError as exc:
        counter.close()
        return None, f"SO_REUSEPORT steering refused: {exc.strerror}"
    return counter, ""


def kernel_refusals() -> tuple[str, str]:
    """Whether this kernel takes the source filter, and the steering that counts what it drops
    apart (as open_receiving attaches them): (why it refuses the filter, why it refuses the
    count), each "" where it takes it. A kernel that refuses only the count still filters."""
    nets = networks(["127.0.0.1"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            attach(s, SO_ATTACH_FILTER, program(nets, WHOLE, 0))
        except OSError as exc:
            return exc.strerror or str(exc), ""
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            attach(s, SO_ATTACH_REUSEPORT_CBPF, program(nets, 0, 1))
        except OSError as exc:
            return "", exc.strerror or str(exc)
    return "", ""
