"""What this machine's receiver can take: its stages' CPU cost per datagram, measured here.

A diode link never slows down for the receiver: whatever the sender paces out, the receiver must
take, or the kernel drops it. `measure_receiver` runs the receiver's own code on datagrams made
with the topology's settings (datagram size, cipher, compression) and records of a given size:

- udp_reader: recv_into from a real UDP socket and the copy it forwards;
- unpacker: verify, decrypt, decompress, split into runs (diode.link.wire, diode.link.runs);
- kafka_writer: decode the runs, order them (diode.accounting.ordering) and hand every record with
its
  provenance headers to a producer (confluent-kafka, not connected: the cost of the produce call
  and librdkafka's enqueue, not the broker's).

From the costs and the instances of each stage it derives the rate the receiver sustains with
every stage under the utilisation `diode tune` plans for (diode.tune.decide.UTILISATION, 70 % of
a core: one figure, so a topology `diode tune` sized for a rate passes `diode check` at that
rate), and with all of the receiver's processes sharing the machine's cores. `diode check`
compares it with link.rate.mbps. The broker's own CPU and the producer's network work are not
counted, so the figure is an upper bound where the destination broker shares this machine.
"""

import os
import socket
import tempfile
import time
from dataclasses import dataclass

from confluent_kafka import Producer

from diode.link import codec, crypto, runs, wire
from diode.link.batching import DatagramBuilder
from diode.runtime.journal import Journal
from diode.kafka.clients import produce_run
from diode.kafka.messages import provenance_headers
from diode.accounting.ordering import PartitionState
from diode.link.path import DATAGRAM_BUFFER, IPV4_UDP
from diode.link.records import Record
from diode.tune.decide import UTILISATION


@dataclass
class ReceiverCapacity:
    record_bytes: int
    records_per_datagram: float
    datagram_bytes: int
    cost_us: dict          # stage -> CPU µs per datagram
    instances: dict        # stage -> instances in the topology
    cores: int

    def max_datagrams_per_second(self) -> tuple[float, str]:
        """(datagrams/s, the stage or "cores" that limits it)."""
        limits = {stage: UTILISATION * self.instances[stage] / (cost * 1e-6)
                  for stage, cost in self.cost_us.items()}
        total = sum(self.cost_us.values()) * 1e-6
        limits["cores"] = UTILISATION * self.cores / total
        stage = min(limits, key=limits.get)
        return limits[stage], stage

    def max_mbps(self) -> tuple[float, str]:
        rate, stage = self.max_datagrams_per_second()
        return rate * (self.datagram_bytes + IPV4_UDP) * 8 / 1e6, stage


def _datagrams(t, record_bytes: int, count: int) -> tuple[list, crypto.Keyring, float]:
    """`count` datagrams of records of `record_bytes` random bytes over four partitions, sealed
    as a packer of this topology seals them; and the keyring to open them."""
    master = os.urandom(32)
    cipher_id = crypto.CIPHER_IDS[t.security.cipher]
    sealer = wire.Sealer(crypto.SessionCipher(cipher_id, master if cipher_id else None, 1),
                         t.compression)
    compressed = t.compression != "none"
    builder = DatagramBuilder(
        t.link.datagram_size_bytes, sealer.seal_body, compressed,
        compress=(lambda p: codec.compress(t.compression, p)) if compressed else None)
    per_run = max(1, min(1000, t.link.datagram_size_bytes // (record_bytes + 30) * 4))
    out, offset, records = [], 0, 0
    while len(out) < count:
        partition, start = offset // per_run % 4, offset // per_run // 4 * per_run
        # each partition's own chain; random values: compression cannot shrink them
        recs = [Record("capacity", partition, o, 1_700_000_000_000, 1, b"key",
                       os.urandom(record_bytes), (), o - 1)
                for o in range(start, start + per_run)]
        sealed, oversize = builder.add(runs.from_records(recs, 4), 0, per_run)
        if oversize:  # records larger than a datagram: fragments cost what their bytes cost
            raise ValueError(f"records of {record_bytes} bytes do not fit a datagram of "
                             f"{t.link.datagram_size_bytes}: measure a smaller size")
        out += [s.datagram for s in sealed]
        records += sum(n for s in sealed for n in s.tags.values())
        offset += per_run
    return out[:count], crypto.Keyring(cipher_id, master if cipher_id else None), \
        records / len(out)


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _udp_reader_cost(made: list, journaled: bool = True) -> float:
    """CPU seconds the udp_reader spends on `made`: recv_into, the copy it forwards, the
    header it routes on, and the journal append (to a scratch journal, without fsync). Sent in
    bursts the socket buffer holds, then read."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    buf = bytearray(DATAGRAM_BUFFER)
    spent = 0.0
    scratch = tempfile.TemporaryDirectory(prefix="diode-check-")
    journal = Journal(scratch.name) if journaled else None
    try:
        if journal is not None:
            journal.open()
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(1.0)
        for start in range(0, len(made), 16):
            burst = made[start:start + 16]
            for d in burst:
                tx.sendto(d, rx.getsockname())

            def read(n=len(burst)):
                batch = []
                for _ in range(n):
                    datagram = bytes(buf[:rx.recv_into(buf)])
                    wire.routing_key(datagram)
                    batch.append(datagram)
                if journal is not None:
                    journal.append(batch)
            spent += _cpu(read)
    except OSError:  # no loopback here: leave it out rather than guess
        return 0.0
    finally:
        rx.close()
        tx.close()
        if journal is not None:
            journal.close()
        scratch.cleanup()
    return spent


def measure_receiver(t, record_bytes: int = 1024, datagrams: int = 400) -> ReceiverCapacity:
    """Measure the receiver stages' CPU cost per datagram on this machine (about a second)."""
    made, keyring, per_datagram = _datagrams(t, record_bytes, datagrams)
    cost = {}

    cost["udp_reader"] = _udp_reader_cost(made, t.receiver.journal_enabled)
    payloads = []

    def unpack():
        for d in made:
            _, payload = wire.unseal(d, keyring)
            payloads.append([bytes(v) for _, _, _, v in runs.split_payload(payload)])
    cost["unpacker"] = _cpu(unpack)

    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0,
                         "queue.buffering.max.messages": 2_000_000,
                         "queue.buffering.max.kbytes": 2_097_151,
                         "delivery.report.only.error": True})

    def write():
        states = {}
        for frames in payloads:
            for frame in frames:
                run = runs.Run.decode(frame)
                state = states.get(run.partition) or states.setdefault(
                    run.partition, PartitionState(1.0))
                writes = state.offer(run, 0.0).writes
                assert writes, "the measurement's chains are in order"
                for w in writes:  # the kafka_writer's own produce call
                    produce_run(producer, "capacity", w.partition, w, w.key_list(),
                                w.value_list(), provenance_headers(
                                    w.topic, w.partition, w.incarnation, w.offsets,
                                    w.header_lists()))
    try:
        cost["kafka_writer"] = _cpu(write)
    finally:
        producer.purge()
    n = len(made)
    return ReceiverCapacity(
        record_bytes, per_datagram, t.link.datagram_size_bytes,
        {stage: seconds / n * 1e6 for stage, seconds in cost.items()},
        {stage: t.stage("receiver", stage).instances for stage in cost},
        len(os.sched_getaffinity(0)))


def check_rate(t, capacity: ReceiverCapacity) -> tuple[list[str], str | None]:
    """(lines describing the measurement, a warning when link.rate.mbps exceeds it)."""
    mbps, limit = capacity.max_mbps()
    costs = ", ".join(f"{stage} {us:.0f} µs" for stage, us in capacity.cost_us.items())
    lines = [f"receiver capacity on this machine, records of {capacity.record_bytes} bytes "
             f"({capacity.records_per_datagram:.0f} per datagram): at most about {mbps:,.0f} "
             f"Mbit/s with every core under {UTILISATION:.0%} (limited by {limit}; the "
             f"destination broker's and librdkafka's network work not counted: "
             f"scripts/bench --mode receiver measures them); CPU per datagram: {costs}"]
    warning = None
    if t.link.rate_mbps > mbps:
        remedy = ("the receiver's cores are the limit: give it more cores" if limit == "cores"
                  else f"add instances of {limit} (receiver.stages.{limit}.instances)")
        warning = (f"link.rate.mbps {t.link.rate_mbps:g} exceeds what this machine's receiver "
                   f"was measured to take: about {mbps:,.0f} Mbit/s of "
                   f"{capacity.record_bytes}-byte records. The kernel will drop datagrams. "
                   f"Lower the rate or {remedy}; --record-bytes measures another size")
    return lines, warning
