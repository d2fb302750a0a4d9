"""The bench's end of the link, a subprocess mode of bench.py:

- `_sink [--capture FILE]`: binds 127.0.0.1 on a free port (printed as `port N`), counts the
  datagrams and bytes it receives without looking at them and, with --capture, appends each to
  FILE as a 4-byte big-endian length and the datagram. On SIGTERM it prints `stats {json}`.
"""

import argparse
import json
import signal
import socket
import struct
import time

from .net import rmem_max

LENGTH = struct.Struct("!I")


def _stop_flag() -> list:
    stop: list = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    return stop


def sink_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="bench.py _sink")
    ap.add_argument("--capture", help="append every datagram to this file (length-prefixed)")
    args = ap.parse_args(argv)
    stop = _stop_flag()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rmem_max() or 4 << 20)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    print(f"port {sock.getsockname()[1]}", flush=True)
    out = open(args.capture, "wb", buffering=1 << 20) if args.capture else None  # noqa: SIM115
    buf = bytearray(65536)
    view = memoryview(buf)
    datagrams = nbytes = 0
    first = last = None
    while not stop:
        try:
            n = sock.recv_into(buf)
        except (TimeoutError, InterruptedError):
            continue
        datagrams += 1
        nbytes += n
        last = time.monotonic()
        first = first or last
        if out is not None:
            out.write(LENGTH.pack(n))
            out.write(view[:n])
    if out is not None:
        out.close()
    print("stats " + json.dumps({"datagrams": datagrams, "bytes": nbytes, "first_at": first,
                                 "last_at": last}), flush=True)
    return 0

