"""unpacker: verifies, decrypts and decompresses datagrams, and forwards their runs.

A datagram's way through it, one call chain: the runtime's loop (diode.runtime.worker.Stage.step)
hands a messages.Data from the udp_reader to Stage._data -> Stage.unpack(datagram) -> diode.link.wire.unseal (the fixed header parsed, the
AEAD tag verified and the payload decrypted by diode.link.crypto.Keyring.open, the sequence
number checked by the replay window, the payload decompressed by diode.link.codec) -> by kind:
heartbeat, source look, digests, metadata (decoded by diode.link.wire), parity (diode.link.fec),
fragment (diode.link.fragments, decompressed once reassembled), else data ->
diode.link.runs.split_payload -> each run to the ToWriter of the writer owning its partition
-> a messages.Batch per writer at the end of the turn (Stage.after_input).

Nothing in a datagram is trusted before its AEAD tag verifies over the header and the payload
(the keyring holds the current key and, during a rotation, the next; rebuilt on a reload);
a datagram of a session is accepted once (diode.link.replay.ReplayWindow).
A datagram that fails any step is counted by reason (diode_rejects_total) and dropped: it never
stops the process and never yields a record. Each run (diode.link.runs) goes, undecoded, to the
kafka_writer that owns its source partition (read from the run's header alone), so
per-partition state lives in one process and no record is touched here.

Each run goes with where it came from: the journal position of its datagram (of the first
datagram of its fragment group or FEC block, which a replay must start from to rebuild it), the
reader's clock when that was read, and whether it is a replay. The reader's marks go on to every
writer, held back to the oldest datagram still buffered here for reassembly or recovery, so a
writer never checkpoints past what a restart would need. A restarted unpacker asks the reader
for a replay (what it held died with its predecessor) and forwards no mark until the replay has
begun (diode.runtime.replays.ReplayRequest; see stages.udp_reader).
"""

import time

from diode.link import codec, fec, fragments, runs, wire
from diode.runtime import transport
from diode.runtime.messages import (Batch, Claim, Data, DigestBatch, Heard, Mark, MetadataLook,
                                    Notice, Origin, SourceLook, as_origin, from_udp_reader)
from diode.link.crypto import Keyring
from diode.errors import RejectedDatagram
from diode.link.records import partition_owner
from diode.link.replay import ReplayWindow
from diode.runtime.worker import Stage as BaseStage

SESSION_WINDOW = 30.0


class ToWriter:
    """What one step gathers for one kafka_writer (a messages.Batch once sent): the runs of
    the partitions it owns with their origins, heartbeat claims, beats (writer 0) and the side
    messages, in the order they came."""

    __slots__ = ("beats", "claims", "origins", "runs", "sources")

    def __init__(self):
        self.runs, self.origins, self.claims, self.beats, self.sources = [], [], [], [], []

    def __bool__(self) -> bool:
        return bool(self.runs or self.claims or self.beats or self.sources)


class Stage(BaseStage):
    # A turn's wait while datagrams are held for reassembly or FEC: its timer that gives them
    # up is a half-second one (and the reader's marks wake it, every
    # udp_reader.IDLE_MARK_SECONDS at least while the link is in use); with none held,
    # IDLE_WAIT_MS.
    POLL_MS = 250

    def open(self):
        ctx = self.ctx
        self.input = transport.pull(ctx.zmq, ctx.bound("in"), ctx.hwm)
        self.outs = [self.outbox(transport.push(ctx.zmq, [e], ctx.hwm))
                     for e in ctx.peers("out")]
        self.keyring = self._keyring()
        self.replay = ReplayWindow()
        # sender sessions seen in this and the previous SESSION_WINDOW seconds
        self.sessions = (set(), set())
        self.sessions_rotated = time.monotonic()
        r = self.t.receiver
        self.record_limit = r.max_record_bytes + runs.FRAMING_ALLOWANCE
        self.reassembler = fragments.Reassembler(
            self.record_limit, max(r.reassembly_max_bytes, self.record_limit),
            r.reassembly_timeout_ms / 1000)
        self.fec = fec.BlockDecoder()
        self.held: dict = {}  # ("fec" | "fragments", session, id) -> lowest journal position
        self.listen(self.input, {Data: self._data, Mark: self._mark, Notice: self._notice},
                    from_udp_reader, limit=8)
        self.every(0.5, self._expire_fragments)
        # A first start lost nothing (what was sent to it waited for it); a restart lost what
        # its predecessor held, and asks the reader to replay it, trusting no mark until then.
        self.replays()
        self._gather()

    def _keyring(self) -> Keyring:
        sec = self.ctx.secrets
        return Keyring(sec.cipher_id, sec.master_key, sec.keys(), sec.key_id)

    def reload(self):
        """The supervisor reloaded the keys (SIGHUP, a rotation's step): datagrams of a key id
        no longer held are rejected from now on (unknown_key)."""
        self.keyring = self._keyring()
        self.log.info("keyring rebuilt: accepting %s", self.ctx.secrets.describe())

    # -- what the loop hands over (diode.runtime.worker.Stage.step) ----------------------------

    def before_input(self, now):
        """Input is taken only while every writer has room (what waits for a writer is sent
        first); while one is behind, the turn waits for it to take something, up to POLL_MS
        (transport.wait_for_room), and takes nothing."""
        flushed = [o.flush() for o in self.outs]  # (each one, not up to the first behind)
        if all(flushed):  # (its timer has work only while something is held to reassemble)
            return self.POLL_MS if self.held else self.IDLE_WAIT_MS
        transport.wait_for_room(self.outs, self.POLL_MS, (self.ctx.wakeup,))
        return None

    def _gather(self) -> None:
        """A turn's output starts empty: a ToWriter per writer, no mark, no notice."""
        self.msgs = [ToWriter() for _ in self.outs]
        self.mark, self.notices = None, []

    def _data(self, message: Data, frames) -> None:
        replayed, seen = message.replayed, message.seen
        for position, datagram in zip(message.positions,
                                      transport.split(message.lengths, frames[1])):
            self.unpack(datagram, self.msgs, as_origin((position, seen, replayed)))

    def _mark(self, message: Mark, frames) -> None:
        if self.replay_request.trusts():
            self.mark = Mark(min(message.position, self._floor()), message.seen)

    def _notice(self, message: Notice, frames) -> None:
        self.notices.append(message.started)
        self.mark = None  # (a mark from before a replay began must not follow its notice)
        self.replay_request.noticed(message.started)

    def after_input(self, now):
        mark, notices = self.mark, self.notices
        for out, m in zip(self.outs, self.msgs):
            if m or mark or notices:
                lengths, body = transport.join(m.runs)
                out.put([Batch(self.ctx.spec.index, m.origins, m.claims, m.beats, mark, notices,
                               lengths, m.sources).encode(), body])
        if mark or notices or any(self.msgs):
            self._gather()
        return True

    def sample_metrics(self):
        super().sample_metrics()
        now = time.monotonic()
        self.metrics.set("sessions_active", len(self.sessions[0] | self.sessions[1]))
        if now - self.sessions_rotated >= SESSION_WINDOW:
            self.sessions = (set(), self.sessions[0])
            self.sessions_rotated = now

    def _floor(self) -> float:
        """The lowest journal position of a datagram still buffered for reassembly or FEC."""
        for key in [k for k in self.held if not (
                self.fec.holds(k[1], k[2]) if k[0] == "fec" else
                self.reassembler.holds(k[1], k[2]))]:
            del self.held[key]
        return min(self.held.values(), default=float("inf"))

    def _hold(self, kind: str, session: int, group: int, position: int) -> int:
        """Remember the first journal position of a group being buffered; returns it."""
        return self.held.setdefault((kind, session, group), position)

    def unpack(self, datagram, msgs: list, origin: Origin) -> None:
        """Open one datagram into the per-writer messages (ToWriter). Never raises."""
        try:
            # A datagram replayed from the journal went through a replay window when it first
            # came (this one may or may not have seen it): the writers' dedup decides now.
            h, payload = wire.unseal(datagram, self.keyring,
                                     None if origin.replayed else self.replay)
            self.sessions[0].add(h.session_id)  # (authenticated: its tag verified)
            if h.kind == wire.KIND_HEARTBEAT:
                self._heartbeat(h, wire.decode_heartbeat(payload), msgs, origin)
                return
            if h.kind == wire.KIND_SOURCE:
                self._source(wire.decode_source(payload), msgs)
                return
            if h.kind == wire.KIND_DIGEST:
                self._digests(wire.decode_digests(payload), msgs)
                return
            if h.kind == wire.KIND_METADATA:  # (writer 0 applies it: diode.kafka.metasync)
                msgs[0].sources.append(MetadataLook(wire.decode_metadata(payload)))
                return
            if h.kind == wire.KIND_PARITY:
                self._parity(h, payload, msgs, origin)
                return
            if h.flags & wire.FLAG_FEC:
                recovered = self.fec.data(h.session_id, h.routing_key, h.seq, bytes(datagram),
                                          time.monotonic())
                if self.fec.holds(h.session_id, h.routing_key) or recovered:
                    first = self._hold("fec", h.session_id, h.routing_key, origin.position)
                    self._recovered(recovered, msgs, origin._replace(position=first))
            if h.kind == wire.KIND_FRAGMENT:
                fragment = fragments.parse(payload)
                payload = self.reassembler.add(h.session_id, fragment, time.monotonic())
                self.metrics.inc("fragments")
                first = self._hold("fragments", h.session_id, fragment.group_id,
                                   origin.position)
                if payload is None:
                    return
                origin = origin._replace(position=first)
                payload = codec.decompress(h.compression, payload, self.record_limit)
                self.metrics.inc("reassembled_records")
            found = runs.split_payload(payload)
        except RejectedDatagram as exc:
            self.metrics.inc("rejects", reason=exc.reason)
            return
        except Exception as exc:  # a bug, not the network's fault: count it, keep going
            self.log.exception("unexpected error unpacking a datagram: %s", exc)
            self.metrics.inc("rejects", reason="internal_error")
            return
        self.metrics.inc("datagrams")
        owners = len(msgs)
        for topic, partition, count, run in found:
            m = msgs[partition_owner(topic, partition, owners)]
            m.runs.append(run)
            m.origins.append(origin)
            self.metrics.inc("records", count)

    def _parity(self, h, payload, msgs, origin) -> None:
        try:
            parity = fec.decode_parity(payload)
        except ValueError as exc:
            raise RejectedDatagram("decode_failed", f"parity: {exc}") from None
        if parity.block_id != h.routing_key:
            raise RejectedDatagram("decode_failed", "parity block id is not its routing key")
        self.metrics.inc("parity_datagrams")
        recovered = self.fec.parity(h.session_id, parity, time.monotonic())
        if self.fec.holds(h.session_id, parity.block_id) or recovered:
            first = self._hold("fec", h.session_id, parity.block_id, origin.position)
            self._recovered(recovered, msgs, origin._replace(position=first))

    def _recovered(self, datagrams, msgs, origin) -> None:
        """Datagrams rebuilt from parity: opened like any other (their own tags verify them)."""
        for datagram in datagrams:
            self.metrics.inc("fec_recovered")
            self.unpack(datagram, msgs, origin)

    def _expire_fragments(self, now: float) -> None:
        self.fec.expire(now)
        self.metrics.set("fec_unrecoverable_blocks", self.fec.blocks_unrecoverable)
        for session, group, got, count in self.reassembler.expire(now):
            self.metrics.inc("rejects", reason="fragments_lost")
            self.log.warning("a record fragmented in %d datagrams (session %016x, group %d) "
                             "lost %d of them: dropped; the loss accounting reports it",
                             count, session, group, count - got)
        self.metrics.set("reassembly_bytes", self.reassembler.buffered_bytes)
        self._floor()  # (forget the groups given up: `held` stays as small as the buffers)

    def _source(self, state: dict, msgs) -> None:
        """A reader's look at its source: each partition's to the writer owning it, with the
        settings of the topics named."""
        self.metrics.inc("heartbeats")
        per = [[] for _ in msgs]
        for entry in state["partitions"]:
            per[partition_owner(entry[0], entry[1], len(msgs))].append(entry)
        for m, entries in zip(msgs, per):
            if entries:
                named = {e[0] for e in entries}
                m.sources.append(SourceLook({
                    **state, "partitions": entries,
                    "topics": [t for t in state["topics"] if t[0] in named]}))

    def _digests(self, batch: dict, msgs) -> None:
        """A reader's digests: each to the writer owning its partition, with the sources'
        states (marked as digests)."""
        per = [[] for _ in msgs]
        for entry in batch["partitions"]:
            per[partition_owner(entry[0], entry[1], len(msgs))].append(entry)
        for m, entries in zip(msgs, per):
            if entries:
                m.sources.append(DigestBatch({**batch, "partitions": entries}))

    def _heartbeat(self, h, beat, msgs, origin) -> None:
        """Claims go to the writers owning their partitions, with the beat's reader and sender
        time and when each one's chain was first named (sender time: as the sender says, or
        for an older sender that does not, this beat's); that the reader was heard then goes
        to every writer (a chain first named after it is accounted from its start:
        diode.accounting.ordering); the beat itself to writer 0."""
        self.metrics.inc("heartbeats")
        seen, live = origin.seen, not origin.replayed
        reader, sent = beat["reader"], beat["time_ms"]
        named = beat.get("named_ms") or [sent] * len(beat["partitions"])
        for (t, p, incarnation, start, last, end, retired), first in zip(beat["partitions"],
                                                                          named):
            msgs[partition_owner(t, p, len(msgs))].claims.append(Claim(
                t, p, incarnation, start, last, end, retired, seen, live, reader, sent,
                min(first, sent)))
        heard = Heard(reader, sent)
        for m in msgs:
            m.sources.append(heard)
        if live:
            beat["session"] = f"{h.session_id:016x}"
            beat["seen"] = seen
            beat["stopping"] = bool(h.flags & wire.FLAG_STOPPING)
            msgs[0].beats.append(beat)
