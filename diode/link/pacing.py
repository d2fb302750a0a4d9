"""Pacing the sender to the link rate without burning a core.

A diode link drops what it cannot carry and nobody tells the sender, so the sender must never
send above the configured rate for long. `open_pacer` picks one of two ways, once, and logs it:

- **kernel fq pacing**: when the route to the receiver leaves by a device whose qdisc is fq
  (`ip route get`, `tc qdisc show`), the socket gets SO_MAX_PACING_RATE and fq spaces its
  packets on the wire. fq drops, silently for UDP, what a flow queues beyond its flow_limit
  (100 packets by default), so the sleeping pacer below still guards the rate, in bursts small
  enough for fq to hold; fq is asked for a little more than the rate (`kernel_headroom`: it
  counts link-layer, IPv6 and fragment headers the pacer does not) so that it drains each burst
  before the next;
- **the sleeping pacer** alone everywhere else (loopback has no qdisc; fq may be missing).

The sleeping pacer (`Pacer`) is a token bucket that never spins: a datagram that must wait
sleeps past its slot by most of the burst allowance (all but SLEEP_OVERSHOOT, at least half),
and the credit earned meanwhile sends the next datagrams without sleeping. One wake-up per
burst, about a thousand a second at 400 Mbit/s, each costing microseconds.

Burst bound: for any datagrams i before j, sent at t_i <= t_j, the bytes of datagrams i..j
are at most rate * (t_j - t_i) + burst_bytes + the bytes of j, however late sleeps wake.
`burst_bytes` gives max(2 datagrams, 1 ms of link time): at 400 Mbit/s, 50 000 bytes (33
datagrams of 1500 on the wire) or 130 056 bytes (2 datagrams of 65 028 on the wire, 2.6 ms). On the
sleeping path a burst leaves at line speed and the receiver's socket buffer absorbs it; with fq
it is spread at the kernel's slightly higher rate, and capped so that fq's flow_limit holds it.
A wake-up later than SLEEP_OVERSHOOT past the burst is not made up: the rate falls short.
"""

import json
import math
import socket
import struct
import subprocess
import time
from dataclasses import dataclass

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux; Python lacks the name
BURST_DATAGRAMS = 2
BURST_SECONDS = 0.001
SLEEP_OVERSHOOT = 0.00025  # how late time.sleep may wake (50-100 µs, more on a busy host)
FQ_DEFAULT_FLOW_LIMIT = 100


def burst_bytes(bytes_per_second: float, datagram_bytes: int) -> int:
    """The burst allowance: a few datagrams or about 1 ms of link time, whichever is larger."""
    return max(BURST_DATAGRAMS * datagram_bytes, int(bytes_per_second * BURST_SECONDS))


def kernel_headroom(datagram_bytes: int) -> float:
    """How much faster than the rate fq is asked to pace. fq counts what the pacer does not: the
    link-layer header of every packet (up to 18 bytes), an IPv6 header's 20 bytes more, the IP
    header of every fragment (up to 4.5 % of a fragmented datagram). Were fq slower than the
    pacer, its queue would grow until it drops."""
    return 1.05 + 40 / datagram_bytes


class Pacer:
    """`wait(n)` returns when `n` more bytes may leave; it sleeps, never spins.

    Reservations follow the rate exactly on a virtual clock (`_next`); idle time earns at most
    `burst_bytes` of credit. `kernel` says whether fq paces the socket as well."""

    def __init__(self, bytes_per_second: float, burst_bytes: int = 0,
                 clock=time.perf_counter, sleep=time.sleep):
        self.rate = bytes_per_second
        self.burst_bytes = burst_bytes
        self.burst = burst_bytes / bytes_per_second if bytes_per_second else 0.0
        # How far past a slot the pacer sleeps: the credit earned meanwhile sends the next
        # datagrams without a sleep, and what is left of the burst absorbs a late wake-up.
        self.sleep_past = max(self.burst / 2, self.burst - SLEEP_OVERSHOOT)
        self.kernel = False
        self._clock = clock
        self._sleep = sleep
        self._next = clock()

    def delay(self, nbytes: int) -> float:
        """Reserve `nbytes`; returns how many seconds to wait before sending them."""
        if not self.rate:
            return 0.0
        now = self._clock()
        # Idle time earns at most `burst` seconds of credit.
        start = max(self._next, now - self.burst)
        self._next = start + nbytes / self.rate
        return max(0.0, start - now)

    def wait(self, nbytes: int) -> None:
        wait = self.delay(nbytes)
        if wait > 0:
            self._sleep(wait + self.sleep_past)
            # A wake-up later than the burst allows earns no more credit than idle time would.
            self._next = max(self._next, self._clock() - self.burst + nbytes / self.rate)


@dataclass(frozen=True)
class Egress:
    """The device the route to the receiver leaves by, and what its qdisc means for pacing."""

    device: str
    qdisc: str               # the root qdisc's kind, "mq/fq" when every queue has fq
    fq_flow_limit: int = 0   # packets a paced flow may queue in fq; 0: no pacing fq
    mtu: int = 1500


def fq_of(qdiscs: list) -> tuple[str, int]:
    """(root kind, fq flow_limit or 0) from `tc -j qdisc show dev X`. fq paces the device's
    traffic when it is the root, or the qdisc of every queue under mq; not with nopacing."""
    roots = [q for q in qdiscs if q.get("root")]
    if len(roots) != 1:
        raise ValueError(f"expected one root qdisc, got {qdiscs!r}")
    root = roots[0]
    leaves = [q for q in qdiscs if not q.get("root") and q["kind"] not in ("ingress", "clsact")]
    if root["kind"] == "fq":
        paced = [root]
    elif root["kind"] == "mq" and leaves and all(q["kind"] == "fq" for q in leaves):
        paced = leaves
    else:
        return root["kind"], 0
    kind = "fq" if paced == [root] else "mq/fq"
    if any(q.get("options", {}).get("pacing") is False for q in paced):
        return f"{kind} nopacing", 0
    return kind, min(q.get("options", {}).get("flow_limit", FQ_DEFAULT_FLOW_LIMIT)
                     for q in paced)


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=5).stdout


def probe_egress(host: str, family=socket.AF_INET, run=_output) -> Egress:
    """Ask `ip` and `tc` where datagrams to `host` leave and which qdisc they meet there.
    Raises OSError, ValueError, LookupError or SubprocessError when it cannot tell."""
    address = socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)[0][4][0]
    device = json.loads(run(["ip", "-j", "route", "get", address]))[0]["dev"]
    mtu = json.loads(run(["ip", "-j", "link", "show", "dev", device]))[0]["mtu"]
    kind, flow_limit = fq_of(json.loads(run(["tc", "-j", "qdisc", "show", "dev", device])))
    return Egress(device, kind, flow_limit, mtu)


def fq_burst_cap(egress: Egress, datagram_bytes: int) -> int:
    """The largest burst fq holds for one flow without dropping: the burst and the datagram
    being sent, in packets (a datagram beyond the MTU leaves in fragments), within flow_limit.
    Negative when not even one datagram fits."""
    packets = 1 if datagram_bytes <= egress.mtu else math.ceil(
        datagram_bytes / (egress.mtu - 48))  # IPv6 and fragment headers in every fragment
    return (egress.fq_flow_limit // packets - 1) * datagram_bytes


def open_pacer(sock, host: str, bytes_per_second: float, datagram_bytes: int, log,
               probe=probe_egress, **timing) -> Pacer:
    """The pacer for `sock`, sending datagrams of up to `datagram_bytes` (headers counted) to
    `host`: kernel fq pacing with a sleeping guard when the egress device has fq and the socket
    takes SO_MAX_PACING_RATE, else the sleeping pacer alone. Logs which, once."""
    if not bytes_per_second:
        log.info("unpaced: link.rate.mbps is 0")
        return Pacer(0, **timing)
    burst = burst_bytes(bytes_per_second, datagram_bytes)
    sleeping = (f"sleeping pacer at {bytes_per_second * 8e-6:g} Mbit/s, bursts of up to "
                f"{burst} bytes")
    try:
        egress = probe(host, sock.family)
    except (OSError, ValueError, LookupError, subprocess.SubprocessError) as exc:
        log.info("%s: cannot tell the qdisc on the way to %s (%s)", sleeping, host, exc)
        return Pacer(bytes_per_second, burst, **timing)
    if not egress.fq_flow_limit:
        log.info("%s: %s has qdisc %s, not fq", sleeping, egress.device, egress.qdisc)
        return Pacer(bytes_per_second, burst, **timing)
    cap = fq_burst_cap(egress, datagram_bytes)
    if cap < 0:
        log.warning("%s: fq on %s holds %d packets per flow, fewer than one %d-byte datagram "
                    "(raise it: tc qdisc change dev %s root fq flow_limit N)", sleeping,
                    egress.device, egress.fq_flow_limit, datagram_bytes, egress.device)
        return Pacer(bytes_per_second, burst, **timing)
    kernel_rate = int(bytes_per_second * kernel_headroom(datagram_bytes))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("=Q", kernel_rate))
    except OSError as exc:
        log.warning("%s: fq on %s, but the socket refused SO_MAX_PACING_RATE (%s)", sleeping,
                    egress.device, exc)
        return Pacer(bytes_per_second, burst, **timing)
    pacer = Pacer(bytes_per_second, min(burst, cap), **timing)
    pacer.kernel = True
    log.info("kernel fq pacing at %g Mbit/s on %s (fq paces at %.4g Mbit/s; a sleeping guard keeps "
             "the rate, bursts of up to %d bytes)", bytes_per_second * 8e-6, egress.device,
             kernel_rate * 8e-6, pacer.burst_bytes)
    return pacer
