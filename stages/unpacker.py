"""unpacker: verifies, decrypts, decompresses and decodes datagrams into records.

Nothing in a datagram is trusted before its AEAD tag verifies over the header and the payload;
a datagram of a session is accepted once (diode.replay.ReplayWindow).
A datagram that fails any step is counted by reason (diode_rejects_total) and dropped: it never
stops the process and never yields a record. Records go to the kafka_writer that owns their
source partition, so per-partition state lives in one process.
"""

import time

from diode import transport, wire
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
        self.keyring = Keyring(ctx.secrets.cipher_id, ctx.secrets.master_key)
        self.replay = ReplayWindow()

    def step(self):
        if not all(o.flush() for o in self.outs):
            time.sleep(0.001)
            return True
        got = self.input.poll(50)
        if self.drained(idle=not got):
            return False
        if not got:
            return True
        batches = [[] for _ in self.outs]
        counts = {}
        for datagrams in transport.drain(self.input, 8):
            for datagram in datagrams:
                self.unpack(datagram, batches, counts)
        for out, batch in zip(self.outs, batches):
            if batch:
                out.put([transport.dumps((batch, counts))])
        return True

    def unpack(self, datagram, batches, counts) -> None:
        try:
            records, partition_counts = wire.open_datagram(datagram, self.keyring, self.replay)
        except RejectedDatagram as exc:
            self.metrics.inc("rejects", reason=exc.reason)
            return
        except Exception as exc:  # a bug, not the network's fault: count it, keep going
            self.log.exception("unexpected error unpacking a datagram: %s", exc)
            self.metrics.inc("rejects", reason="internal_error")
            return
        counts.update(partition_counts)
        self.metrics.inc("datagrams")
        self.metrics.inc("records", len(records))
        for r in records:
            batches[partition_owner(r.topic, r.partition, len(batches))].append(r)
