"""A flood of random UDP datagrams, as fast as one process sends them (sendmmsg, many datagrams
per system call), for the receiver's flood test and its figures in docs/threat-model.md.

    python -m tests.flood --source 127.0.0.2 --target 127.0.0.1:3456 --seconds 10

Every datagram is random bytes (a few payloads in turn), `--size` bytes long (1472: a full
Ethernet frame). It sends from `--source` (an address of this host: on loopback, any of
127.0.0.0/8) for `--seconds` and prints what it sent, one JSON line: datagrams, seconds, rate.
"""

import argparse
import ctypes
import ctypes.util
import json
import os
import socket
import sys
import time

BATCH = 256      # datagrams per sendmmsg
PAYLOADS = 16    # distinct random payloads sent in turn


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(IoVec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


def flood(source: str, target: tuple, seconds: float, size: int = 1472) -> dict:
    """Send random `size`-byte datagrams from `source` to `target` for `seconds`: what went."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((source, 0))
    sock.connect(target)  # (no address per message)
    payloads = [ctypes.create_string_buffer(os.urandom(size), size) for _ in range(PAYLOADS)]
    iovs = (IoVec * BATCH)(*[IoVec(ctypes.cast(payloads[i % PAYLOADS], ctypes.c_void_p), size)
                             for i in range(BATCH)])
    msgs = (MMsgHdr * BATCH)()
    for i in range(BATCH):
        msgs[i].hdr.iov = ctypes.pointer(iovs[i])
        msgs[i].hdr.iovlen = 1
    sent = refused = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        n = libc.sendmmsg(sock.fileno(), msgs, BATCH, 0)
        if n < 0:  # (ECONNREFUSED from an earlier datagram's ICMP, ENOBUFS: go on)
            refused += 1
            continue
        sent += n
    elapsed = time.monotonic() - start
    sock.close()
    return {"datagrams": sent, "seconds": round(elapsed, 2), "per_second": int(sent / elapsed),
            "bytes": size, "failed_calls": refused}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.flood", description=__doc__.split("\n")[0])
    p.add_argument("--source", default="127.0.0.2", help="address to send from")
    p.add_argument("--target", required=True, help="host:port to flood")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", type=int, default=1472, help="bytes of each datagram")
    args = p.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    print(json.dumps(flood(args.source, (host, int(port)), args.seconds, args.size)),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
