"""What a reader's heartbeat costs with its partitions idle, by sender.heartbeat.claims.max, at
1 000 and 10 000 source partitions (diode.kafka.claims): per heartbeat, the bytes and datagrams
that cross the link, and the CPU time (time.process_time) of each side's part in it, the stages'
own functions called in this process (no broker, no socket):

- reader: the claims of every partition (as stages.kafka_reader._heartbeat makes them), the
  slice chosen (ClaimSlices.choose), when each was first named, the message to the packer;
- packer: stages.packer's _heartbeat: the claims split over datagrams, encoded, sealed;
- receiver: each datagram opened and decoded (diode.link.wire), stages.unpacker's _heartbeat
  (a Claim per partition), the messages to the writer; then stages.kafka_writer's _claim for each
  and the expiry pass over the partitions they touched (the writer's states written up to the
  last offset sent: nothing waits).

K is within how many heartbeats every claim is named (ceil(partitions / max)); at 1 heartbeat a
second the CPU time per heartbeat in ms is a tenth of the share of a core in %.
Run by `.venv/bin/python scripts/heartbeat_claims.py` (about a minute). Not a test: a figure."""

import argparse
import math
import time
from types import SimpleNamespace

import zmq

from diode.kafka.claims import ClaimSlices
from diode.link import crypto, wire
from diode.link.records import NO_INCARNATION
from diode.runtime import messages
from diode.runtime.metrics import Metrics
from stages import packer, unpacker
from benchlib.writer_cost import fill, per_call, writer

LAST = 1000        # the last offset sent of every partition, as the writer's states hold it
DATAGRAM = 1472    # link.datagram.size.bytes (an MTU of 1500)
MASTER = crypto.master_key_from_password(b"pw", b"salt")


class Reader:
    """A kafka_reader's heartbeat, its partitions idle: the claims as _heartbeat makes them."""

    def __init__(self, partitions: int, most: int):
        self.chain_start = {("t", p): 0 for p in range(partitions)}
        self.positions = {tp: LAST + 1 for tp in self.chain_start}
        self.ends = dict(self.positions)
        self.incarnations = {"t": NO_INCARNATION}
        self.claims = ClaimSlices(most)

    def beat(self) -> bytes:
        positions, ends, incarnations = self.positions, self.ends, self.incarnations
        claims = [(t, p, incarnations.get(t, NO_INCARNATION), start, positions[(t, p)] - 1,
                   ends.get((t, p), 0) - 1, False)
                  for (t, p), start in self.chain_start.items()
                  if positions.get((t, p), start) - 1 >= start]
        parts = self.claims.choose(claims)
        now_ms = int(time.time() * 1000)
        beat = {"reader": 0, "time_ms": now_ms, "interval_ms": 1000.0, "partitions": parts,
                "named_ms": self.claims.named_at(parts, now_ms), "cluster": "c" * 22,
                "counters": {"records": 1, "rewinds": 0, "inflight": 0}, "stopping": False}
        self.claims.carried_now(parts, now_ms)
        return messages.Heartbeat(beat).encode()


def sealing_packer():
    """What stages.packer's _heartbeat uses of its stage: datagrams sealed, kept in `out`."""
    p = SimpleNamespace(builder=SimpleNamespace(budget=DATAGRAM - wire.HEADER_BYTES - crypto.TAG_BYTES,
                                                flush=lambda: ()),
                        sealer=wire.Sealer(crypto.SessionCipher(1, MASTER, 1), "none"),
                        metrics=Metrics({"stage": "packer"}), out=[])
    p._emit = lambda *a: None
    p._put = lambda datagrams, meta: p.out.extend(datagrams)
    p._seal_fitted = lambda *a, **k: packer.Stage._seal_fitted(p, *a, **k)
    return p


def measure(partitions: int, most: int) -> dict:
    reader, p = Reader(partitions, most), sealing_packer()
    keyring = crypto.Keyring(1, MASTER)
    u = SimpleNamespace(metrics=Metrics({"stage": "unpacker"}))
    zctx = zmq.Context()
    w = writer(zctx)
    try:
        fill(w, partitions, 0)
        clock = [0.0]
        handed = []

        def read():
            handed.append(reader.beat())

        def pack():
            p.out.clear()
            packer.Stage._heartbeat(p, messages.from_reader(handed.pop()), None)

        def receive():
            to = [unpacker.ToWriter()]
            for dg in p.out:
                h, payload = wire.unseal(dg, keyring)
                unpacker.Stage._heartbeat(u, h, wire.decode_heartbeat(payload), to,
                                          SimpleNamespace(seen=clock[0], replayed=False))
            batch = messages.Batch.decode(messages.Batch(
                0, [], to[0].claims, to[0].beats, None, [], [], to[0].sources).encode())
            for c in batch.claims:
                w._claim(c)
            clock[0] += 1.0
            w._expire(clock[0])

        for _ in range(math.ceil(partitions / max(1, most or partitions)) + 1):  # (warm)
            read()
            pack()
            receive()
        figures = {"reader": per_call(lambda: (read(), handed.clear())) * 1e3}
        read()
        pack()
        sizes = [len(d) for d in p.out]

        def pack_again():
            read()
            pack()
        figures["packer"] = per_call(pack_again) * 1e3 - figures["reader"]
        figures["receiver"] = per_call(lambda: (read(), pack(), receive())) * 1e3 - \
            figures["reader"] - figures["packer"]
        return {"K": reader.claims.every(), "bytes": sum(sizes), "datagrams": len(sizes),
                **figures}
    finally:
        w.close()
        zctx.destroy(linger=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--most", type=int, nargs="+", default=[0, 250, 500, 1000, 2000, 5000],
                    help="values of sender.heartbeat.claims.max")
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 10000])
    args = ap.parse_args()
    print("| partitions | claims.max | K | bytes | datagrams | reader | packer | receiver |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.partitions:
        for most in args.most:
            m = measure(n, most)
            print(f"| {n} | {most} | {m['K']} | {m['bytes']} | {m['datagrams']} | "
                  f"{m['reader']:.2f} ms | {m['packer']:.2f} ms | {m['receiver']:.2f} ms |")


if __name__ == "__main__":
    main()
