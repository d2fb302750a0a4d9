"""UDP segmentation offload: many datagrams per system call, each still a datagram of its own.

At MTU-sized datagrams the cost per datagram decides the rate (85 000 a second for 1 Gbit/s at
1472 bytes), and a Python call per datagram is most of it. Linux batches at the syscall boundary
(QUIC stacks do the same):

- **GSO** (`UDP_SEGMENT`, level SOL_UDP 17, option 103) on the sender: one sendmsg of up to
  64 KiB of datagrams of one size (the last may be shorter), which the kernel (or the NIC) cuts
  into datagrams; each is still one sealed datagram that decrypts alone;
- **GRO** (`UDP_GRO`, option 104) on the receiver: one recvmsg returns datagrams of one flow the
  kernel coalesced, the segment size in a control message; the udp_reader cuts them apart again,
  and journals and forwards each as before.

Either may be refused (an old kernel, another platform): the stage then sends or receives one
datagram per call, says so once in its log and exports it (`diode_udp_offload`).
"""

import errno
import socket
import struct

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
MAX_SEGMENTS = 64        # the kernel's UDP_MAX_SEGMENTS
MAX_GSO_BYTES = 65000    # payload bytes of one GSO send (the kernel takes up to 64 KiB)
GRO_BUFFER = 1 << 17     # a receive buffer that holds a whole coalesced batch
GRO_CMSG_SPACE = socket.CMSG_SPACE(4)


def enable_gro(sock: socket.socket) -> str:
    """Turn GRO on for a receiving socket: "" when it is on, else why not."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError as exc:
        return f"UDP_GRO refused by the kernel ({exc.strerror})"
    return ""


def gso_refused(family: int = socket.AF_INET) -> str:
    """Whether this kernel takes UDP_SEGMENT: "" when it does, else why not."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.setsockopt(SOL_UDP, UDP_SEGMENT, 1472)
    except OSError as exc:
        return f"UDP_SEGMENT refused by the kernel ({exc.strerror})"
    return ""


def refused(exc: OSError, segments: int) -> bool:
    """Whether a failed send of `segments` datagrams was the kernel refusing the batch, not the
    network failing: EINVAL (no UDP_SEGMENT here), EMSGSIZE (segments longer than the egress
    device's MTU: datagrams the path fragments, with link.allow.fragmentation) or EIO (a device
    that cannot checksum them). Sent one datagram per call, the same datagrams go."""
    return segments > 1 and exc.errno in (errno.EINVAL, errno.EMSGSIZE, errno.EIO)


def segment_size(ancdata) -> int | None:
    """The GRO segment size a recvmsg's control messages carry (None: one datagram)."""
    for level, kind, data in ancdata:
        if level == SOL_UDP and kind == UDP_GRO and len(data) >= 2:
            return struct.unpack_from("i" if len(data) >= 4 else "H", data)[0]
    return None


def segments(view: memoryview, nbytes: int, size: int | None) -> list:
    """The datagrams of a receive of `nbytes` (GRO: cut every `size` bytes), as bytes."""
    if not size or size >= nbytes:
        return [bytes(view[:nbytes])]
    return [bytes(view[i:min(i + size, nbytes)]) for i in range(0, nbytes, size)]


def batches(datagrams: list) -> list:
    """`datagrams` in order as GSO sends: (start, end, segment size) of runs of equal sizes
    (a run's last datagram may be shorter, and ends it), at most MAX_SEGMENTS datagrams and
    MAX_GSO_BYTES bytes each. A batch of one is sent as a plain datagram."""
    out, i, n = [], 0, len(datagrams)
    while i < n:
        size = len(datagrams[i])
        j, total = i + 1, size
        while j < n and j - i < MAX_SEGMENTS and total + len(datagrams[j]) <= MAX_GSO_BYTES:
            length = len(datagrams[j])
            if length > size:
                break
            total += length
            j += 1
            if length < size:
                break  # (only the last may be shorter)
        out.append((i, j, size))
        i = j
    return out


def send_batch(sock: socket.socket, datagrams: list, size: int, addr) -> None:
    """One GSO send of datagrams of `size` bytes (the last may be shorter)."""
    if len(datagrams) == 1:
        sock.sendto(datagrams[0], addr)
        return
    sock.sendmsg(datagrams, [(SOL_UDP, UDP_SEGMENT, struct.pack("H", size))], 0, addr)
