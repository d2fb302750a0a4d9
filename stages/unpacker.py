"""unpacker: verifies, decrypts and decompresses datagrams, and forwards their runs.

Nothing in a datagram is trusted before its AEAD tag verifies over the header and the payload;
a datagram of a session is accepted once (diode.replay.ReplayWindow).
A datagram that fails any step is counted by reason (diode_rejects_total) and dropped: it never
stops the process and never yields a record. Each run (diode.runs) goes, undecoded, to the
kafka_writer that owns its source partition (read from the run's header alone), so
per-partition state lives in one process and no record is touched here.
"""

import time

from diode import codec, fec, fragments, runs, transport, wire
from diode.crypto import Keyring
from diode.errors import RejectedDatagram
from diode.records import partition_owner
from diode.replay import ReplayWindow
from diode.worker import Stage as BaseStage


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        self.input = transport.pull(ctx.zmq, ctx.endpoint("unpacker", ctx.spec.index), ctx.hwm)
        n = ctx.instances("kafka_writer")
        self.outs = [transport.Outbox(transport.push(ctx.zmq, [ctx.endpoint("kafka_writer", i)],
                                                     ctx.hwm)) for i in range(n)]
        sec = ctx.secrets
        self.keyring = Keyring(sec.cipher_id, sec.master_key, sec.keys(), sec.key_id)
        self.replay = ReplayWindow()
        r = self.t.receiver
        self.record_limit = r.max_record_bytes + 65536  # a record's batch framing included
        self.reassembler = fragments.Reassembler(
            self.record_limit, max(r.reassembly_max_bytes, self.record_limit),
            r.reassembly_timeout_ms / 1000)
        self.next_expire = 0.0
        self.fec = fec.BlockDecoder()

    def step(self):
        now = time.monotonic()
        if now >= self.next_expire:
            self._expire_fragments(now)
            self.next_expire = now + 0.5
        if not all(o.flush() for o in self.outs):
            time.sleep(0.001)
            return True
        got = self.input.poll(50)
        if self.drained(idle=not got):
            return False
        if not got:
            return True
        msgs = [([], [], []) for _ in self.outs]  # per writer: runs, heartbeat claims, beats
        for datagrams in transport.drain(self.input, 8):
            for datagram in datagrams:
                self.unpack(datagram, msgs)
        for out, (frames, claims, beats) in zip(self.outs, msgs):
            if frames or claims or beats:
                out.put([transport.dumps((claims, beats)), *frames])
        return True

    def unpack(self, datagram, msgs) -> None:
        """Open one datagram into the per-writer messages. Never raises."""
        try:
            h, payload = wire.unseal(datagram, self.keyring, self.replay)
            if h.kind == wire.KIND_HEARTBEAT:
                self._heartbeat(h, wire.decode_heartbeat(payload), msgs)
                return
            if h.kind == wire.KIND_PARITY:
                self._parity(h, payload, msgs)
                return
            if h.flags & wire.FLAG_FEC:
                self._recovered(self.fec.data(h.session_id, h.routing_key, h.seq,
                                              bytes(datagram), time.monotonic()), msgs)
            if h.kind == wire.KIND_FRAGMENT:
                payload = self.reassembler.add(h.session_id, fragments.parse(payload),
                                               time.monotonic())
                self.metrics.inc("fragments")
                if payload is None:
                    return
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
            msgs[partition_owner(topic, partition, owners)][0].append(run)
            self.metrics.inc("records", count)

    def _parity(self, h, payload, msgs) -> None:
        try:
            parity = fec.decode_parity(payload)
        except ValueError as exc:
            raise RejectedDatagram("decode_failed", f"parity: {exc}") from None
        if parity.block_id != h.routing_key:
            raise RejectedDatagram("decode_failed", "parity block id is not its routing key")
        self.metrics.inc("parity_datagrams")
        self._recovered(self.fec.parity(h.session_id, parity, time.monotonic()), msgs)

    def _recovered(self, datagrams, msgs) -> None:
        """Datagrams rebuilt from parity: opened like any other (their own tags verify them)."""
        for datagram in datagrams:
            self.metrics.inc("fec_recovered")
            self.unpack(datagram, msgs)

    def _expire_fragments(self, now: float) -> None:
        self.fec.expire(now)
        self.metrics.set("fec_unrecoverable_blocks", self.fec.blocks_unrecoverable)
        for session, group, got, count in self.reassembler.expire(now):
            self.metrics.inc("rejects", reason="fragments_lost")
            self.log.warning("a record fragmented in %d datagrams (session %016x, group %d) "
                             "lost %d of them: dropped; the loss accounting reports it",
                             count, session, group, count - got)
        self.metrics.set("reassembly_bytes", self.reassembler.buffered_bytes)

    def _heartbeat(self, h, beat, msgs) -> None:
        """Claims go to the writers owning their partitions; the beat itself to writer 0."""
        self.metrics.inc("heartbeats")
        for t, p, start, last in beat["partitions"]:
            msgs[partition_owner(t, p, len(msgs))][1].append((t, p, start, last))
        beat["session"] = f"{h.session_id:016x}"
        msgs[0][2].append(beat)
