"""The bench's two ends of the link, each a subprocess mode of bench.py:

- `_sink [--capture FILE] [--bind ADDR]`: binds 127.0.0.1 (or ADDR: the test bed's receiving
  host) on a free port (printed as `port N`), counts the
  datagrams and bytes it receives without looking at them and, with --capture, appends each to
  FILE as a 4-byte big-endian length and the datagram. On SIGTERM it prints `stats {json}`.
- `_replay FILE PORT [--rate-mbps R] [--queue-limit BYTES] [--host ADDR --netns-pid PID]`:
  sends a capture's datagrams to 127.0.0.1:PORT (or ADDR:PORT, a socket it sees through
  /proc/PID/net) in order. It prints `ready` once something is bound there and starts on a
  `go` line on stdin. Unpaced (R = 0) it keeps the receiving socket's queue under
  --queue-limit bytes (/proc/net/udp rx_queue), i.e. as fast as the receiver takes them
  without a drop; paced, it sends R Mbit/s in chunks of about 2 ms and sleeps between them.
  When done it prints `done {json}` and stays until SIGTERM (so its CPU can be read).
"""

import argparse
import json
import mmap
import select
import signal
import socket
import struct
import sys
import time

from diode.link import offload

from .net import rmem_max, udp_socket

LENGTH = struct.Struct("!I")
CHUNK_DATAGRAMS = 16  # the unpaced replayer looks at the receiver's queue this often


def _stop_flag() -> list:
    stop: list = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    return stop


def sink_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="bench.py _sink")
    ap.add_argument("--capture", help="append every datagram to this file (length-prefixed)")
    ap.add_argument("--bind", default="127.0.0.1")
    args = ap.parse_args(argv)
    stop = _stop_flag()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rmem_max() or 4 << 20)
    sock.bind((args.bind, 0))
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


def capture_index(data) -> list[tuple[int, int]]:
    """(start, length) of every datagram in a capture."""
    out, pos = [], 0
    while pos + LENGTH.size <= len(data):
        (n,) = LENGTH.unpack_from(data, pos)
        pos += LENGTH.size
        if pos + n > len(data):
            break  # a datagram cut short: the capture ended while writing it
        out.append((pos, n))
        pos += n
    return out


def replay_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="bench.py _replay")
    ap.add_argument("capture")
    ap.add_argument("port", type=int)
    ap.add_argument("--rate-mbps", type=float, default=0.0)
    ap.add_argument("--queue-limit", type=int, default=2 << 20)
    ap.add_argument("--no-gso", action="store_true",
                    help="one datagram per send call (else UDP GSO, as diode's sender)")
    ap.add_argument("--host", default="127.0.0.1", help="the receiver's address")
    ap.add_argument("--netns-pid", type=int,
                    help="a process in the receiver's network namespace (its socket is seen "
                         "through /proc/PID/net)")
    args = ap.parse_args(argv)
    stop = _stop_flag()
    with open(args.capture, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(data)
    index = capture_index(data)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    while udp_socket(args.port, args.host, args.netns_pid) is None and not stop:
        time.sleep(0.01)  # the receiver's udp_reader is not bound yet
    print(f"ready {len(index)} datagrams", flush=True)
    while not stop and not select.select([sys.stdin], [], [], 0.2)[0]:
        pass
    if stop or sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.monotonic()
    try:
        sent, nbytes, waits = _send(sock, view, index, (args.host, args.port), args, stop, t0)
        error = None
    except OSError as exc:  # the receiver went away (ICMP port unreachable)
        sent = nbytes = waits = 0
        error = str(exc)
    seconds = time.monotonic() - t0
    print("done " + json.dumps({"datagrams": sent, "bytes": nbytes, "seconds": seconds,
                                "queue_waits": waits, "error": error}), flush=True)
    while not stop:
        time.sleep(0.1)
    view.release()
    data.close()
    return 0


def _send(sock, view, index, dest, args, stop, t0) -> tuple[int, int, int]:
    """Send every datagram of `index` (paced or as the receiver's queue allows); returns
    (datagrams sent, bytes sent, times the receiver's queue made it wait)."""
    nbytes = waits = i = 0
    rate = args.rate_mbps * 1e6 / 8  # bytes per second
    chunk_bytes = max(rate * 0.002, 1)
    while i < len(index) and not stop:
        if rate:
            chunk = 0
            while i < len(index) and chunk < chunk_bytes:
                sent = _send_some(sock, view, index[i:i + offload.MAX_SEGMENTS], dest, args)
                chunk += sent[1]
                i += sent[0]
            nbytes += chunk
            ahead = t0 + nbytes / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            continue
        q = udp_socket(dest[1], dest[0], args.netns_pid)
        if q is not None and q["rx_queue"] > args.queue_limit:
            waits += 1
            time.sleep(0.0005)  # the receiver is behind: let it read
            continue
        end = min(i + CHUNK_DATAGRAMS, len(index))
        while i < end:
            count, sent = _send_some(sock, view, index[i:end], dest, args)
            i += count
            nbytes += sent
    return i, nbytes, waits


def _send_some(sock, view, entries, dest, args) -> tuple[int, int]:
    """The first datagrams of `entries` in one call, as diode's udp_sender sends them (a GSO
    batch, diode.link.offload; one datagram with --no-gso): (datagrams, bytes) sent."""
    if args.no_gso:
        start, n = entries[0]
        sock.sendto(view[start:start + n], dest)
        return 1, n
    datagrams = [view[start:start + n] for start, n in entries[:offload.MAX_SEGMENTS]]
    _, end, size = offload.batches(datagrams)[0]
    try:
        offload.send_batch(sock, datagrams[:end], size, dest)
    except OSError as exc:
        if not offload.refused(exc, end):
            raise
        args.no_gso = True  # (as diode's udp_sender: one datagram per call from now on)
        return _send_some(sock, view, entries, dest, args)
    return end, sum(n for _, n in entries[:end])
