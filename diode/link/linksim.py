"""A UDP link simulator: relays datagrams from one port to another and injects faults.

The kernel here has no netem, and a real diode's faults must be reproducible in tests and soak
runs, so this relay injects them itself, from a seeded random generator: uniform loss, bursts of
consecutive losses, reordering (a datagram held back while later ones overtake it), duplication,
corruption (one flipped bit) and a fixed delay. `diode link-sim --help` for the options; it prints
what it did as JSON when it stops.

With `--control HOST:PORT` it also takes new fault settings while it runs (`diode soak` changes
them on its schedule): each UDP datagram to that address is a JSON object of FaultSettings
fields (`{"loss": 1.0}` takes the link down, `{}` restores the settings it started with); it
answers each with the settings now in force, or an error.
"""

import dataclasses
import heapq
import json
import random
import select
import socket
import time
from dataclasses import asdict, dataclass, field

from diode.link.path import DATAGRAM_BUFFER


@dataclass(frozen=True)
class FaultSettings:
    loss: float = 0.0              # probability a datagram is dropped
    burst_probability: float = 0.0  # probability a burst of losses starts at a datagram
    burst_length: int = 5          # datagrams dropped in a row by a burst
    reorder: float = 0.0           # probability a datagram is held back
    reorder_delay_ms: float = 5.0  # how long a held-back datagram waits
    duplicate: float = 0.0         # probability a datagram is sent twice
    corrupt: float = 0.0           # probability one bit of a datagram is flipped
    delay_ms: float = 0.0          # added to every datagram
    seed: int = 1


@dataclass
class FaultCounts:
    received: int = 0
    forwarded: int = 0
    dropped: int = 0
    burst_dropped: int = 0
    reordered: int = 0
    duplicated: int = 0
    corrupted: int = 0
    dropped_indexes: list = field(default_factory=list)  # 0-based arrival order


class Faults:
    """Pure fault decisions: what becomes of the n-th datagram."""

    MAX_DROPPED_INDEXES = 100000

    def __init__(self, settings: FaultSettings):
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.counts = FaultCounts()
        self._burst_left = 0

    def decide(self, datagram: bytes) -> list[tuple[float, bytes]]:
        """(delay in seconds, bytes) for each copy to forward; empty when dropped."""
        s, c, rng = self.s, self.counts, self.rng
        index = c.received
        c.received += 1
        if self._burst_left == 0 and s.burst_probability and rng.random() < s.burst_probability:
            self._burst_left = s.burst_length
        if self._burst_left:
            self._burst_left -= 1
            c.burst_dropped += 1
            self._dropped(index)
            return []
        if s.loss and rng.random() < s.loss:
            c.dropped += 1
            self._dropped(index)
            return []
        if s.corrupt and datagram and rng.random() < s.corrupt:
            bit = rng.randrange(len(datagram) * 8)
            flipped = bytearray(datagram)
            flipped[bit // 8] ^= 1 << (bit % 8)
            datagram = bytes(flipped)
            c.corrupted += 1
        delay = s.delay_ms / 1000
        if s.reorder and rng.random() < s.reorder:
            delay += s.reorder_delay_ms / 1000
            c.reordered += 1
        copies = [(delay, datagram)]
        if s.duplicate and rng.random() < s.duplicate:
            copies.append((delay, datagram))
            c.duplicated += 1
        c.forwarded += len(copies)
        return copies

    def _dropped(self, index: int) -> None:
        if len(self.counts.dropped_indexes) < self.MAX_DROPPED_INDEXES:
            self.counts.dropped_indexes.append(index)


class LinkSim:
    """The relay. `run(should_stop)` until should_stop() is true; `report()` after."""

    def __init__(self, listen: tuple, forward: tuple, faults: Faults, rcvbuf: int = 1 << 25,
                 control: tuple | None = None):
        self.faults = faults
        self.initial = faults.s
        self.control = None
        if control:
            self.control = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.control.bind(control)
        self.forward = forward
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.rx.bind(listen)
        self.rx.setblocking(False)
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.port = self.rx.getsockname()[1]
        self._queue: list = []  # heap of (due, n, datagram)
        self._n = 0

    def run(self, should_stop) -> None:
        buf = bytearray(DATAGRAM_BUFFER)
        while not should_stop():
            timeout = 0.05
            if self._queue:
                timeout = max(0.0, min(timeout, self._queue[0][0] - time.monotonic()))
            readable, _, _ = select.select([self.rx, *filter(None, [self.control])], [], [],
                                           timeout)
            if self.control in readable:
                self._take_control()
            if self.rx in readable:
                for _ in range(256):
                    try:
                        n = self.rx.recv_into(buf)
                    except BlockingIOError:
                        break
                    now = time.monotonic()
                    for delay, dg in self.faults.decide(bytes(buf[:n])):
                        self._n += 1
                        heapq.heappush(self._queue, (now + delay, self._n, dg))
            self._send_due()
        self._send_due(flush=True)

    def _take_control(self) -> None:
        """Apply the settings in one control datagram (over those it started with) and answer
        with the settings in force, or with the error."""
        data, peer = self.control.recvfrom(65536)
        try:
            changes = json.loads(data)
            if not isinstance(changes, dict):
                raise ValueError("settings must be a JSON object")
            known = {f.name: f.type for f in dataclasses.fields(FaultSettings)}
            unknown = sorted(set(changes) - set(known))
            if unknown:
                raise ValueError(f"unknown settings {unknown}")
            settings = dataclasses.replace(self.initial,
                                           **{k: known[k](v) for k, v in changes.items()})
            self.faults.s = settings
            if "seed" in changes:  # a fault of its own: its own reproducible draws
                self.faults.rng = random.Random(settings.seed)
            answer = {"settings": asdict(settings)}
            print(f"link-sim: {time.time():.3f} settings {json.dumps(changes)}", flush=True)
        except (ValueError, TypeError) as exc:
            answer = {"error": str(exc)}
        self.control.sendto(json.dumps(answer).encode(), peer)

    def _send_due(self, flush: bool = False) -> None:
        now = time.monotonic()
        while self._queue and (flush or self._queue[0][0] <= now):
            _, _, dg = heapq.heappop(self._queue)
            try:
                self.tx.sendto(dg, self.forward)
            except OSError:
                pass  # the receiver is not there: a lossy link loses it

    def report(self) -> dict:
        return {"settings": asdict(self.faults.s), "counts": asdict(self.faults.counts)}

    def close(self) -> None:
        if self.control:
            self.control.close()
        self.rx.close()
        self.tx.close()


def main(args) -> int:
    """`diode link-sim`: relay until SIGINT/SIGTERM or --duration, then print the report."""
    import signal
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    settings = FaultSettings(
        loss=args.loss, burst_probability=args.burst_probability,
        burst_length=args.burst_length, reorder=args.reorder,
        reorder_delay_ms=args.reorder_delay_ms, duplicate=args.duplicate, corrupt=args.corrupt,
        delay_ms=args.delay_ms, seed=args.seed)
    host, _, port = args.listen.rpartition(":")
    fhost, _, fport = args.forward.rpartition(":")
    control = None
    if args.control:
        chost, _, cport = args.control.rpartition(":")
        control = (chost, int(cport))
    sim = LinkSim((host, int(port)), (fhost, int(fport)), Faults(settings), control=control)
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    print(f"link-sim: {args.listen} -> {args.forward} {json.dumps(asdict(settings))}",
          flush=True)
    try:
        sim.run(lambda: stop["now"] or time.monotonic() > deadline)
    finally:
        sim.close()
    report = sim.report()
    report["counts"]["dropped_indexes"] = report["counts"]["dropped_indexes"][:1000]
    text = json.dumps(report)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("link-sim", help="relay UDP with injected loss, reordering, duplication, "
                       "corruption and delay (a lab stand-in for a diode link)")
    p.add_argument("--listen", required=True, help="host:port to receive on (the sender's "
                   "link.host/link.port)")
    p.add_argument("--forward", required=True, help="host:port to relay to (the receiver)")
    p.add_argument("--loss", type=float, default=0.0, help="uniform loss probability")
    p.add_argument("--burst-probability", type=float, default=0.0,
                   help="probability that a burst of losses starts at a datagram")
    p.add_argument("--burst-length", type=int, default=5, help="datagrams lost per burst")
    p.add_argument("--reorder", type=float, default=0.0,
                   help="probability a datagram is held back --reorder-delay-ms")
    p.add_argument("--reorder-delay-ms", type=float, default=5.0,
                   help="how long a reordered datagram is held back (default 5)")
    p.add_argument("--duplicate", type=float, default=0.0, help="duplication probability")
    p.add_argument("--corrupt", type=float, default=0.0,
                   help="probability one bit of a datagram is flipped")
    p.add_argument("--delay-ms", type=float, default=0.0, help="fixed delay of every datagram")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the random draws: the same seed, the same faults (default 1)")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds")
    p.add_argument("--report", help="also write the JSON report to this file")
    p.add_argument("--control", metavar="HOST:PORT", help="take new fault settings while "
                   "running: UDP datagrams of JSON FaultSettings fields ({} restores the "
                   "starting ones); bind it to 127.0.0.1")
    p.set_defaults(func=main)
