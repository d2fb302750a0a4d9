"""udp_sender: the one process that writes to the link.

It paces datagrams to link.rate.mbps (diode.link.pacing: the kernel's fq where the egress device has
it, a sleeping pacer always) and, once the kernel has taken a datagram, acknowledges its records
to the readers that read them: only then may their offsets be committed. Consecutive datagrams of
one size leave in one call (UDP GSO, diode.link.offload) where the kernel takes it.

A datagram's way through it: the runtime's loop (diode.runtime.worker.Stage.step) hands a
messages.Datagrams from a packer to _datagrams -> the backlog -> _send_backlog (the pacer's
wait, diode.link.offload.send_batch, link.copies times; Stage.after_input, or
Stage.before_input for what is left) -> _flush_acks -> a messages.Acks to each reader whose
records it carried.
"""

import socket
import time
from collections import deque
from itertools import islice

import zmq

from diode.link import offload, pacing, path
from diode.runtime import transport
from diode.runtime.messages import Acks, Datagrams
from diode.runtime.worker import Stage as BaseStage

# UDP and IPv4 headers: pacing counts what the link carries.
IP_UDP_OVERHEAD = path.IPV4_UDP
MAX_PENDING_ACKS = 100_000  # per reader, while it cannot be reached


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        link = self.t.link
        self.input = transport.pull(ctx.zmq, ctx.bound("in"), ctx.hwm)
        self.acks = [transport.push(ctx.zmq, [e], ctx.hwm * 16) for e in ctx.peers("acks")]
        self.addr = (link.host, link.port)
        family = socket.AF_INET6 if ":" in link.host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
        self.pacer = pacing.open_pacer(self.sock, link.host, link.rate_mbps * 1e6 / 8,
                                       link.datagram_size_bytes + IP_UDP_OVERHEAD, self.log)
        self.metrics.set("kernel_pacing", int(self.pacer.kernel))
        refused = offload.gso_refused(family) if link.gso_enabled else "link.gso.enabled false"
        self._gso(not refused, refused if link.gso_enabled else "")
        self.pending_acks: dict[int, list] = {}
        self.backlog = deque()  # (datagram, what it carries) from a packer, not yet sent
        self.listen(self.input, self._datagrams, Datagrams.decode)

    # -- the runtime's loop (diode.runtime.worker.Stage.step) ---------------------------------

    def before_input(self, now):
        """A backlog left (the network refused a send) is sent first, and no input taken this
        turn: not a spin, the pacer waits between datagrams and a refused send 0.2 s. Then the
        acknowledgements that wait for their reader, tried again every POLL_MS while some
        wait; with none, a packer's datagrams are all it waits for (IDLE_WAIT_MS)."""
        if self.backlog:
            self._send_backlog()
            return None
        if self.pending_acks:
            self._flush_acks()
        return self.POLL_MS if self.pending_acks else self.IDLE_WAIT_MS

    def _datagrams(self, message: Datagrams, frames) -> None:
        self.backlog.extend(zip(transport.split(message.lengths, frames[1]), message.carried))

    def after_input(self, now):
        if self.backlog:
            self._send_backlog()
        return True

    def _gso(self, on: bool, why: str = "") -> None:
        self.gso = on
        self.metrics.set("udp_offload", int(on))
        if why:
            self.log.warning("%s: one datagram per send call", why)

    def _send_backlog(self):
        while self.backlog:
            head = [datagram for datagram, _ in islice(self.backlog, offload.MAX_SEGMENTS)]
            end, size = offload.batches(head)[0][1:] if self.gso else (1, len(head[0]))
            group = head[:end]
            wire_bytes = sum(map(len, group)) + IP_UDP_OVERHEAD * len(group)
            try:
                for _ in range(self.t.link.copies):  # the receiver's replay window drops extras
                    self.pacer.wait(wire_bytes)
                    offload.send_batch(self.sock, group, size, self.addr)
            except OSError as exc:
                if self.gso and offload.refused(exc, len(group)):
                    # (segments longer than the path's MTU, with link.allow.fragmentation)
                    self._gso(False, f"UDP_SEGMENT refused for {size}-byte datagrams "
                                     f"({exc.strerror})")
                    continue
                # Not handed to the kernel: not acknowledged, so never committed. Retried at the
                # next step until the network comes back.
                self.metrics.inc("errors", reason="send")
                self.log.warning("sendto %s:%d failed (%s); retrying", *self.addr, exc)
                time.sleep(0.2)
                break
            sent = 0
            for _ in group:
                _, carried = self.backlog.popleft()
                for reader, msg_id, n in carried:
                    self.pending_acks.setdefault(reader, []).append((msg_id, n))
                    sent += n
            self.metrics.inc("records", sent)
            self.metrics.inc("datagrams", len(group))
            self.metrics.inc("syscalls", self.t.link.copies)
            self.metrics.inc("bytes", wire_bytes - IP_UDP_OVERHEAD * len(group))
        self._flush_acks()

    def _flush_acks(self):
        """Send each reader its acknowledgements. A reader not connected yet (at start, or
        restarting) gets them at a later step; past MAX_PENDING_ACKS the oldest go (a reader
        that is gone rewinds, and its successor ignores acknowledgements of messages it did not
        send)."""
        for reader in list(self.pending_acks):
            acks = self.pending_acks[reader]
            try:
                self.acks[reader].send(Acks(acks).encode(), zmq.NOBLOCK)
            except zmq.Again:
                del acks[:-MAX_PENDING_ACKS]
                continue
            del self.pending_acks[reader]

    def close(self):
        self.sock.close()
