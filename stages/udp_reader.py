"""udp_reader: the receiver's one UDP socket. It reads, journals and forwards.

The socket is made by the supervisor before it forks (`prepare`), so it outlives this process: a
killed reader comes back to the same socket, and the kernel queues what arrives meanwhile. It is
bound to link.bind.address, and a datagram from an address not in link.source.addresses never
reaches it: the kernel's socket filter drops it (or this reader does, first thing, where the
kernel refused the filter; diode.link.admission).

Every datagram whose fixed header is ours is appended to the receive journal
(diode.runtime.journal), still encrypted, before it goes on; one too short or not ours (wrong magic
or version) is counted and dropped here, and nothing else in it is trusted or even looked at.
Datagrams go to unpackers by the routing key of their fixed header (routing key % unpackers),
many per ZeroMQ message, in one frame.

Forwarding is a cursor over the journal. While the unpackers keep up, a batch goes on as it was
read; while they are behind (a destination outage), the reader keeps reading the socket into the
journal, up to receiver.journal.max.bytes, and forwards from the journal when there is room.

Messages to an unpacker (diode.runtime.messages):
- Data(replayed, positions, seen, lengths), then one frame of the datagrams end to end
  (transport.join): `seen` is this reader's clock when the datagrams were read; `replayed`: they
  come again from the journal after a restart (the unpacker's replay window has seen them, or
  not: their records' dedup decides);
- Mark(position, seen): every datagram below `position`, and every one read before `seen`,
  has been forwarded in this message stream. Writers measure the reorder wait on this clock, so
  a queue or a dead worker downstream never turns into a false gap, and checkpoint up to the
  position. No mark goes out while a replay is under way; one goes every MARK_SECONDS while
  datagrams are forwarded, every IDLE_MARK_SECONDS while none are (the clock alone moves);
- Notice(started): a replay started at `started`; a worker that asked for a replay before
  then has its lost input coming.

A datagram's way through it: the runtime's loop (diode.runtime.worker.Stage.step) reads the
socket in Stage.poll_input -> _receive (GRO segments split by diode.link.offload) -> _accept
(the fixed header's routing key: diode.link.wire.routing_key), and hands the batch to
Stage.take_input -> _append (the journal) -> _forward, or at a later turn's after_input
_forward_from_journal -> a Data message to the unpacker of its lane. A mark goes out at the
start of a turn (a timer, _mark_due), so it claims only what earlier turns forwarded.

The reader replays the journal when it starts, from the lowest low water of the writers'
checkpoints (diode.runtime.checkpoints), and again whenever a restarted unpacker or writer asks on
the control endpoint (a ReplayAsk: diode.runtime.replays, looked at first at every turn; a
first start has lost nothing: what was sent to it waited for it). Without a journal
(receiver.journal.enabled false) positions only count datagrams and nothing is replayed.
"""

import errno
import socket
import time
from collections import deque
from typing import NamedTuple

from diode.runtime import checkpoints, replays, transport
from diode.runtime.messages import Data, Mark, Notice
from diode.link import admission, offload, path, udpstat, wire
from diode.errors import DiodeError, RejectedDatagram
from diode.runtime.journal import HEADER, Journal, JournalError, JournalFull
from diode.runtime.worker import Stage as BaseStage

BATCH_DATAGRAMS = 64          # per unpacker per message
MARK_SECONDS = 0.02           # marks at least this often while traffic flows
IDLE_MARK_SECONDS = 0.1       # and this often while nothing more was forwarded (the clock alone)
HOUSEKEEPING_SECONDS = 1.0    # journal release, metrics
TIMES_MAX = 100_000           # (position, clock) entries kept for datagrams not yet forwarded
MAX_DATAGRAM = path.DATAGRAM_BUFFER
RECORD_HEADER = HEADER.size   # a journal record's header: positions are record starts


def lane(key: int) -> int:
    """A routing key spread over the unpackers (Fibonacci hashing): keys that step by a
    constant (fragment groups advance by the fragments of each record, FEC blocks by one) would
    otherwise all land on one unpacker."""
    return ((key * 0x9E3779B1) & 0xFFFFFFFF) >> 16


def open_socket(t, log) -> admission.Receiving:
    """The link's receiving socket, bound and filtered by source (diode.link.admission), with as
    large a receive buffer as the kernel grants; says once what it admits and what it could
    not do."""
    link = t.link
    receiving = admission.open_receiving(link.bind_address, link.port,
                                         link.receive_buffer_bytes, link.source_addresses,
                                         link.gro_enabled)
    rcvbuf = link.receive_buffer_bytes
    granted = receiving.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # (doubled)
    if granted < rcvbuf:
        log.warning("the kernel granted a %d-byte receive buffer, not the %d asked for "
                    "(link.receive.buffer.bytes): bursts will be dropped. Raise the limit with: "
                    "sysctl -w net.core.rmem_max=%d net.core.rmem_default=%d",
                    granted, rcvbuf, rcvbuf, rcvbuf)
    if link.bind_address_note and admission.every_address(link.bind_address):
        log.warning("link.bind.address %s", link.bind_address_note)
    for level, message in receiving.notes:
        getattr(log, level)("%s", message)
    return receiving


def open_journal(t) -> Journal | None:
    r = t.receiver
    if not r.journal_enabled:
        return None
    journal = Journal(t.resolve(r.journal_dir), r.journal_max_bytes, r.journal_segment_bytes,
                      r.journal_fsync, r.journal_fsync_interval_ms / 1000)
    try:
        journal.open()
    except JournalError as exc:
        raise JournalError(f"receiver.journal.dir: {exc}") from None
    return journal


class Read(NamedTuple):
    """Datagrams from journal `position` on were read at `clock` (the reader's clock, which
    the marks carry to the writers)."""
    position: int
    clock: float


class Stage(BaseStage):
    # A head stage: what comes after a stop is not read (what is journaled and not forwarded
    # goes on at the next start).
    TAKES_INPUT_WHILE_STOPPING = False
    # An idle turn's wait: its timers are the marks (every IDLE_MARK_SECONDS while nothing is
    # forwarded) and the housekeeping; a datagram, a replay asked for, or room in an unpacker
    # that was behind ends the wait (_wait).
    POLL_MS = round(IDLE_MARK_SECONDS * 1000)

    @classmethod
    def prepare(cls, t, log) -> dict:
        """In the supervisor, before forking: the socket (it outlives a killed reader), and a
        journal directory that cannot be written is an error now, not a restart loop."""
        receiving = open_socket(t, log)
        try:
            journal = open_journal(t)
        except DiodeError:
            receiving.close()
            raise
        if journal is not None:
            journal.close()
        return {"receiving": receiving}

    def open(self):
        ctx = self.ctx
        link = self.t.link
        self.writers = ctx.instances("kafka_writer")
        self.outs = [self.outbox(transport.push(ctx.zmq, [e], ctx.hwm))
                     for e in ctx.peers("out")]
        self.control = transport.pull(ctx.zmq, ctx.bound("control"), 64)
        inherited = ctx.inherited.get("receiving")
        self.receiving = inherited or open_socket(self.t, self.log)
        self.sock = self.receiving.sock
        if inherited is not None:
            # The kernel's counts of the sockets (sample_metrics) began with the supervisor's
            # socket, not this process: a restarted reader exports what they grew past its
            # predecessors' export (diode.runtime.metrics), not the whole count once more.
            self.metrics.carry("socket_drops", *(("source_filtered_datagrams",)
                                                 if self.receiving.counter is not None else ()))
        # Datagrams from addresses not admitted: dropped by the kernel, or here where it
        # refused the filter (diode.link.admission), before anything looks at them.
        self.admits = (self.receiving.admits if self.receiving.where == admission.READER
                       else None)
        self.filtered = 0  # (counted here where the reader filters)
        self.metrics.set("source_filter", self.receiving.where)
        # Non-blocking, waiting in poll() alone: a socket with a timeout makes Python wait for
        # readiness even with MSG_DONTWAIT, so a burst read in one go would take as long as the
        # datagrams took to come, held in memory, not journaled (lost to a kill -9 meanwhile).
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()  # (waited on with the ZeroMQ sockets: _wait)
        self.metrics.set("receive_buffer_bytes",
                         self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2)
        # Many datagrams per receive call (diode.link.offload), where the kernel does GRO.
        refused = offload.enable_gro(self.sock) if link.gro_enabled else "link.gro.enabled false"
        self.gro = not refused
        self.metrics.set("udp_offload", int(self.gro))
        if refused and link.gro_enabled:
            self.log.warning("%s: one datagram per receive call", refused)
        self.buf = bytearray(offload.GRO_BUFFER if self.gro else MAX_DATAGRAM)
        self.view = memoryview(self.buf)
        self.journal = open_journal(self.t)
        if self.journal is not None:
            self.journal.start_syncing()  # (an fsync must not stop the socket being read)
            # (what an alert divides diode_journal_bytes by)
            self.metrics.set("journal_max_bytes", self.journal.max_bytes)
        self.dir = self.t.resolve(self.t.receiver.journal_dir)
        self.low_waters = checkpoints.LowWaters(self.dir, self.writers)  # (read as they change)
        self.end = self.journal.end if self.journal else 0   # next position
        self.cursor = self.end            # next position to forward
        self.times: deque = deque()       # Read: when datagrams waiting in the journal came
        self.reading = None               # journal reader while forwarding from the journal
        self.replay_end = 0               # positions below it are forwarded as replayed
        self.replay_started = 0.0
        self.marked = None                # Read: the last mark's position and when it went
        self.journal_failing = False
        self.retry_at = 0.0               # when a failing journal is tried again
        self.full_since = None
        self.room = self.caught_up = True  # (at the turn's start: before_input)
        self.batch = []                    # the turn's datagrams read: [(routing key, bytes)]
        # At the start of every turn, in this order: a replay asked for is answered before
        # anything else is read or forwarded; the journal's condition; the mark, which claims
        # only what the turns before forwarded.
        self.every(0.0, self._requests)
        self.every(HOUSEKEEPING_SECONDS, self._housekeeping)
        self.marks = self.every(MARK_SECONDS, self._mark_due)
        self.log.info("listening on udp %s:%d%s", link.bind_address, link.port,
                      f", journal in {self.dir}" if self.journal else ", no journal")
        self._replay(time.monotonic())    # what was journaled before this start goes on again

    # -- what the loop does (diode.runtime.worker.Stage.step) ---------------------------------

    def before_input(self, now):
        """Whether the unpackers have room, and whether everything read has gone on. The turn
        waits (up to POLL_MS) unless there is room and something journaled to forward: for a
        datagram, and while an unpacker is behind, for it to take something as well (_wait)."""
        flushed = [o.flush() for o in self.outs]  # (each one, not up to the first behind)
        self.room = all(flushed)
        self.caught_up = self.cursor == self.end
        if self.room and not self.caught_up:
            return 0
        if self.marked is None or self.marked.position != self.cursor:
            return round(MARK_SECONDS * 1000)  # (a mark is due for what went on)
        return self.POLL_MS

    def poll_input(self, wait_ms: int) -> list:
        """The socket is this stage's input: the turn's batch (_receive), after waiting up to
        `wait_ms` for a datagram."""
        self.batch = self._receive(wait_ms)
        return self.batch

    def take_input(self) -> None:
        """Journal the batch read and forward it now, while the unpackers keep up; else it
        waits in the journal for the cursor."""
        batch = self.batch
        now = time.monotonic()
        items = self._append(batch, now)
        if items is None:
            pass  # in the journal, forwarded from there when there is room
        elif self.caught_up and self.room or self.journal is None or self.journal_failing:
            # (without a journal the outboxes hold it, and reading stops until they empty)
            self._forward(items, False, now)
            if self.caught_up:
                self.cursor = self.end
        else:
            self._remember(items[0][0], now)

    def after_input(self, now):
        """Forward a batch from the journal when there is room (its mark goes out at the start
        of a later turn: _mark_due); without room, the next turn waits for it (_wait)."""
        if self.room and self.cursor < self.end and all(o.flush() for o in self.outs):
            self._forward_from_journal()
        return True

    def _wait(self, wait_ms: int, read: bool) -> bool:
        """Wait up to `wait_ms` for an unpacker that was behind to take something, a replay to
        be asked for, or (`read`) a datagram: a replay is answered at once, and the turns of a
        reader held back by its unpackers (a destination outage) are as few as those of an idle
        one. True when one came."""
        if not wait_ms:
            return True
        return transport.wait_for_room(self.outs, wait_ms,
                                       (self.control, self.ctx.wakeup, self.fd) if read else
                                       (self.control, self.ctx.wakeup))

    def finish(self, now):
        """Stopping (a head stage: nothing more is read): a last mark. What is journaled and
        not forwarded is replayed at the next start."""
        self._mark(now)
        return False

    def _receive(self, wait_ms: int) -> list:
        """Datagrams waiting on the socket (waiting up to `wait_ms` for one), as many as
        the journal has room for, in at most as many receive calls: a turn ends however many
        of them are dropped here (a flood of datagrams not ours would otherwise keep it
        reading, unbeating, until the supervisor kills it); none while the unpackers are
        behind and there is no journal to hold them (the kernel buffer absorbs the burst)."""
        if not self.room and (self.journal is None or self.journal_failing):
            self._wait(wait_ms, False)
            return []
        limit = BATCH_DATAGRAMS * len(self.outs)
        if self.journal is not None and not self.journal_failing:
            room = self.journal.max_bytes - self.journal.size
            limit = min(limit, max(0, room) // (MAX_DATAGRAM + RECORD_HEADER))
            if limit == 0:
                self._full(True)
                if wait_ms:  # (wait for room, the housekeeping's release, a replay asked for)
                    self._wait(wait_ms, False)
                return []
            self._full(False)
        out = []
        if wait_ms and not self._wait(wait_ms, True):
            return out
        calls = total = 0
        admits = self.admits  # (None: the kernel filters, or nothing does)
        try:
            while len(out) < limit and calls < limit:
                if self.gro:
                    nbytes, anc, _, source = self.sock.recvmsg_into([self.buf],
                                                                     offload.GRO_CMSG_SPACE)
                    size = offload.segment_size(anc)
                elif admits is None:
                    nbytes, size = self.sock.recv_into(self.buf), None
                else:
                    (nbytes, source), size = self.sock.recvfrom_into(self.buf), None
                calls += 1
                total += nbytes
                if admits is not None and not admits(source[0]):
                    self.filtered += -(-nbytes // size) if size else 1
                    continue
                self._accept(out, offload.segments(self.view, nbytes, size))
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EINTR):
                self.log.warning("recv failed: %s", exc)
        if calls:
            self.metrics.inc("syscalls", calls)
            self.metrics.inc("bytes", total)
        return out

    def _accept(self, out: list, datagrams: list) -> None:
        """Datagrams read from the socket: those whose header is ours, with their routing
        keys, into `out`; the rest counted and dropped."""
        self.metrics.inc("datagrams", len(datagrams))
        for datagram in datagrams:
            try:
                out.append((wire.routing_key(datagram), datagram))
            except RejectedDatagram as exc:
                self.metrics.inc("rejects", reason=exc.reason)

    def _append(self, batch: list, now: float):
        """Journal a batch read from the socket: [(position, routing key, datagram)], or None
        when the journal has no room (then it was not read: see _receive)."""
        if self.journal is None:
            first = self.end
            self.end += len(batch)
            return [(first + i, k, d) for i, (k, d) in enumerate(batch)]
        if self.journal_failing:
            self._retry_journal(now)
            if self.journal_failing:
                return [(self.end, k, d) for k, d in batch]  # not journaled: not replayable
        try:
            positions = self.journal.append([d for _, d in batch])
        except JournalFull:  # (the room was checked: only a race with release)
            self._full(True)
            self.metrics.inc("journal_dropped_datagrams", len(batch))
            return None
        except JournalError as exc:
            self._journal_failed(exc, now)
            return [(self.end, k, d) for k, d in batch]
        self.end = self.journal.end
        return [(p, k, d) for p, (k, d) in zip(positions, batch)]

    def _remember(self, position: int, now: float) -> None:
        """When datagrams from `position` on were read (they wait in the journal)."""
        if not self.times or now - self.times[-1].clock > MARK_SECONDS:
            if len(self.times) < TIMES_MAX:
                self.times.append(Read(position, now))

    def _forward(self, items: list, replayed: bool, seen: float) -> None:
        """Datagrams (position, routing key, bytes) to their unpackers, in one message each."""
        n = len(self.outs)
        per = [([], []) for _ in range(n)]
        for position, key, datagram in items:
            positions, frames = per[lane(key) % n]
            positions.append(position)
            frames.append(datagram)
        for out, (positions, frames) in zip(self.outs, per):
            if frames:
                lengths, body = transport.join(frames)
                out.put([Data(replayed, positions, seen, lengths).encode(), body])
        if replayed:
            self.metrics.inc("replayed_datagrams", len(items))

    def _forward_from_journal(self) -> None:
        """Forward what waits in the journal from the cursor, a batch a step."""
        if self.reading is None:
            try:
                self.reading = self.journal.read(self.cursor)
            except JournalError as exc:  # (a checkpoint that names no record of this journal)
                self.metrics.inc("journal_errors")
                self.log.error("cannot replay the journal from %d: %s; going on from its end "
                               "(the loss accounting reports what that skips)", self.cursor, exc)
                self.cursor = self.end
                return
            self.reading_end = self.journal.end
        items = []
        limit = BATCH_DATAGRAMS * len(self.outs)
        for position, datagram in self.reading:
            if position < self.cursor:
                continue
            try:
                key = wire.routing_key(datagram)
            except RejectedDatagram:  # (checked before it was journaled: a damaged journal)
                self.metrics.inc("rejects", reason="journal_damaged")
                continue
            items.append((position, key, datagram))
            if len(items) >= limit:
                break
        else:  # read up to where the journal ended when this reading began
            self.reading = None
        if items:
            self.cursor = items[-1][0] + RECORD_HEADER + len(items[-1][2])  # the next record
            replayed = [i for i in items if i[0] < self.replay_end]
            fresh = [i for i in items if i[0] >= self.replay_end]
            if replayed:
                self._forward(replayed, True, self.replay_started)
            if fresh:
                while len(self.times) > 1 and self.times[1].position <= fresh[-1][0]:
                    self.times.popleft()
                seen = self.times[0].clock if self.times else time.monotonic()
                self._forward(fresh, False, seen)
        if self.reading is None:
            self.cursor = max(self.cursor, self.reading_end)

    def _mark_due(self, now: float) -> None:
        """The marks' timer: a mark when the unpackers have room and no replay is under way,
        else at the first turn it can go (a stopping reader's last mark is `finish`'s). While
        nothing more was forwarded, a mark only moves the writers' clock: one goes every
        IDLE_MARK_SECONDS, not at every turn (each woke every unpacker and every writer: the
        idle receiver's turns)."""
        if self.stopping:
            return
        if self.marked is not None and self.marked.position == self.cursor and \
                now - self.marked.clock < IDLE_MARK_SECONDS:
            return  # (nothing forwarded since the last mark: only the clock would move)
        if not (all(o.flush() for o in self.outs) and self._mark(now)):
            self.marks.at(now)

    def _mark(self, now: float) -> bool:
        """Tell the unpackers how far forwarding has come (see the module); False while a
        replay is under way (no mark then)."""
        if self.cursor < self.replay_end:
            return False
        if self.cursor < self.end:
            while len(self.times) > 1 and self.times[1].position <= self.cursor:
                self.times.popleft()
            seen = self.times[0].clock if self.times else now
        else:
            self.times.clear()
            seen = now
        frame = Mark(self.cursor, seen).encode()
        for out in self.outs:
            if not out.full:
                out.put([frame])
        self.marked = Read(self.cursor, now)
        return True

    # -- replays ---------------------------------------------------------------------------------

    def _requests(self, now: float) -> None:
        late = replays.waiting(self.control, self.replay_started)
        if late:
            self.log.info("replaying the journal for %s", ", ".join(sorted(set(late))))
            self._replay(now)

    def _replay(self, now: float) -> None:
        """Forward the journal again from the writers' lowest checkpoint."""
        self.replay_started = now
        if self.journal is not None:
            low = self.low_waters.get()
            start = self.journal.start if low is None else max(low, self.journal.start)
            if start < self.cursor:
                self.cursor = start
                self.reading = None
            self.replay_end = max(self.replay_end, self.end)
            self.metrics.inc("replays")
        frame = Notice(now).encode()
        for out in self.outs:
            out.put([frame])

    # -- the journal's condition -------------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        if self.journal is None:
            return
        if self.journal.sync_error is not None:
            self._journal_failed(self.journal.sync_error, now)
            self.journal.sync_error = None
        if self.journal_failing:
            self._retry_journal(now)
        low = self.low_waters.get()
        if low is not None:
            freed = self.journal.release(min(low, self.cursor))
            if freed:
                self.metrics.inc("journal_released_bytes", freed)
        self.metrics.set("journal_bytes", self.journal.size)
        self.metrics.set("journal_unforwarded_bytes", self.end - self.cursor)

    def _full(self, full: bool) -> None:
        if full and self.full_since is None:
            self.full_since = time.monotonic()
            self.metrics.set("journal_full", 1)
            self.log.error("the journal holds %d bytes, its bound (receiver.journal.max.bytes): "
                           "not reading the socket until the destination takes more; the kernel "
                           "drops what comes meanwhile and those records are reported missing",
                           self.journal.size)
        elif not full and self.full_since is not None:
            self.log.warning("the journal has room again after %.0f s",
                             time.monotonic() - self.full_since)
            self.full_since = None
            self.metrics.set("journal_full", 0)

    def _journal_failed(self, exc: Exception, now: float) -> None:
        self.metrics.inc("journal_errors")
        if not self.journal_failing:
            self.log.error("cannot write the journal: %s. Forwarding without it: a restart now "
                           "loses what is in flight (reported missing). Retrying every second.",
                           exc)
        self.journal_failing = True
        self.metrics.set("journal_failing", 1)
        self.retry_at = now + 1.0

    def _retry_journal(self, now: float) -> None:
        """Try the journal again (at most once a second) once everything journaled went on."""
        if now < self.retry_at or self.cursor < self.journal.end:
            return
        self.retry_at = now + 1.0
        try:
            self.journal.close()
            self.journal.open()
            self.journal.start_syncing()
        except JournalError as exc:
            self.metrics.inc("journal_errors")
            self.log.debug("journal still failing: %s", exc)
            return
        self.journal_failing = False
        self.metrics.set("journal_failing", 0)
        self.end = self.cursor = max(self.end, self.journal.end)
        self.log.warning("journal writable again")

    def sample_metrics(self):
        super().sample_metrics()
        kernel, counter = udpstat.of(self.sock, self.receiving.counter)
        if kernel is not None:  # datagrams lost to a full receive buffer: the reader was late
            self.metrics.set("socket_drops", kernel["drops"])
            self.metrics.set("socket_queue_bytes", kernel["rx_queue"])
        if counter is not None:  # what the kernel's source filter dropped (exactly)
            self.metrics.set("source_filtered_datagrams", counter["drops"])
        elif self.admits is not None:
            self.metrics.set("source_filtered_datagrams", self.filtered)

    def close(self):
        if self.journal is not None:
            self.journal.close()  # (fsyncs first under policy interval)
        self.receiving.close()
