"""How a run's progress is read without loading the machine, and how a run is waited for.

- WatermarkMeter: records in a destination topic, from its partitions' offsets (ListOffsets
  every tick), never by reading the records. The writers are idempotent producers, so the
  offsets count records. Tansu's "latest" offset is the first offset of the last batch written
  + 1, not the end (docs/design.md §8): a lower bound. When the watermarks stop moving the meter
  reads the tail of each partition whose watermark moved since its last tail read, from there
  to the end of the partition (a batch at most), and takes the end from the last record: exact
  on both brokers, and cheap, since nothing is read while the watermarks move and a partition
  is read again only after a new batch. With `exact` (Apache Kafka, whose "latest" is the end)
  no tail is read: over 10 000 partitions of Tansu one tail read's unassign blocked the bench
  for minutes. A run's end is the tick at which the watermarks last moved (a new batch always
  moves them, on Tansu too).
- CommitMeter: records a consumer group has committed (the sender's kafka_reader commits what
  was handed to the kernel), from its committed offsets every tick.
- verify_distinct (--verify): the one exact count after a run, by reading every record once and
  counting distinct sourcePartition/sourceOffset headers, so duplicates cannot hide losses.
"""

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from .resources import check_interrupted
from .workload import PARTITIONS

# partitions per ListOffsets request: one request for 10 000 partitions at once crashed the
# bench's process inside librdkafka (a heap corruption) and takes seconds on a loaded broker
LIST_OFFSETS_BATCH = 1000


def list_offsets(admin: AdminClient, specs: dict, request_timeout: float = 5,
                 batch: int = LIST_OFFSETS_BATCH) -> dict:
    """admin.list_offsets over `specs` (TopicPartition -> OffsetSpec) in requests of `batch`
    partitions, one after the other: TopicPartition -> offset, or the KafkaException it failed
    with."""
    out: dict = {}
    tps = list(specs)
    for i in range(0, len(tps), batch):
        futures = admin.list_offsets({tp: specs[tp] for tp in tps[i:i + batch]},
                                     request_timeout=request_timeout)
        for tp, f in futures.items():
            try:
                out[tp] = f.result().offset
            except KafkaException as e:
                out[tp] = e
    return out


class _Progress:
    """count (records so far), first_at / last_at (monotonic time of the first tick that saw a
    record and of the last tick that saw progress)."""

    def __init__(self):
        self.count = 0
        self.first_at = None
        self.last_at = None

    def _moved(self, now: float) -> None:
        self.last_at = now
        if self.first_at is None:
            self.first_at = now


class WatermarkMeter(_Progress):
    def __init__(self, bootstrap: str, topic: str | None, partitions: int = PARTITIONS,
                 tps: list | None = None, exact: bool = False):
        """Every partition of `topic`, or the partitions `tps` (TopicPartitions, any topics);
        `exact` when the broker's "latest" is the partition's end (no tail read)."""
        super().__init__()
        self.exact = exact
        self.tps = tps if tps is not None else [TopicPartition(topic, p)
                                                for p in range(partitions)]
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.tail = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-meter",
                              "enable.auto.commit": False, "enable.partition.eof": True,
                              "fetch.wait.max.ms": 10})
        # keyed by (topic, partition)
        self.low = {(tp.topic, tp.partition): 0 for tp in self.tps}
        self.reported: dict = {}        # "latest" as the broker reports it
        self.end = {(tp.topic, tp.partition): 0 for tp in self.tps}  # the end found so far
        self.tailed_at = None  # per partition, the reported offset its last tail read started
        # from (None: not read, or not to the end)
        self.tail_reads = 0
        self.missing = {tp.topic for tp in self.tps}  # topics not seen in the metadata yet
        self.next_look = 0.0

    def _present(self) -> list:
        """The partitions of the topics the broker's metadata has (looked at again every
        second while some are missing: a system that creates its topics makes them one by
        one)."""
        now = time.monotonic()
        if self.missing and now >= self.next_look:
            self.next_look = now + 1.0
            md = self.admin.list_topics(timeout=5).topics
            self.missing = {t for t in self.missing
                            if t not in md or md[t].error is not None or not md[t].partitions}
        return [tp for tp in self.tps if tp.topic not in self.missing]

    def _list(self, spec) -> dict:
        """Each partition's offset; one not there yet (a topic the system has still to create)
        keeps what it had, 0 at first. Raises KafkaException when none answered."""
        # one topic missing fails the whole request: ask only for the topics that exist
        answers = list_offsets(self.admin, {tp: spec for tp in self._present()})
        if not answers:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        out, failures, error = {}, 0, None
        for tp, answer in answers.items():
            key = (tp.topic, tp.partition)
            if isinstance(answer, KafkaException):
                out[key], failures, error = self.reported.get(key, 0), failures + 1, answer
            else:
                out[key] = answer
        if failures == len(answers):
            raise error
        for tp in self.tps:  # the topics not there yet
            out.setdefault((tp.topic, tp.partition), self.reported.get((tp.topic, tp.partition), 0))
        return out

    def poll(self, force_tail: bool = False) -> int:
        try:
            reported = self._list(OffsetSpec.latest())
            if not self.reported:
                self.low = self._list(OffsetSpec.earliest())
        except KafkaException:
            return self.count  # a broker busy or electing: the next tick asks again
        # when the answer came: a first request to a cold broker can take seconds, and the
        # records it reports may have been written all through them
        now = time.monotonic()
        moved = reported != self.reported
        self.reported = reported
        for p, o in reported.items():
            self.end[p] = max(self.end[p], o)
        if moved and sum(reported.values()) > sum(self.low.values()):
            self._moved(now)
        if (force_tail or not moved) and not self.exact and reported != self.tailed_at:
            self._read_tail(reported)
        self.count = sum(max(0, self.end[p] - self.low[p]) for p in self.end)
        return self.count

    def _read_tail(self, reported: dict, timeout: float = 5.0) -> None:
        """Each written partition whose reported "latest" moved since its last tail read, from
        that "latest" - 1 to the end of the partition."""
        before = self.tailed_at or {}
        start = [TopicPartition(t, p, max(self.low[(t, p)], reported[(t, p)] - 1))
                 for t, p in self.end if reported[(t, p)] > self.low[(t, p)]
                 and before.get((t, p)) != reported[(t, p)]]
        self.tailed_at = dict(reported)
        if not start:
            return
        self.tail_reads += 1
        self.tail.assign(start)
        open_ = {(tp.topic, tp.partition) for tp in start}
        deadline = time.monotonic() + timeout
        try:
            while open_ and time.monotonic() < deadline:
                for m in self.tail.consume(1000, 0.2):
                    err = m.error()
                    key = (m.topic(), m.partition())
                    if err is None:
                        self.end[key] = max(self.end[key], m.offset() + 1)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        open_.discard(key)
        finally:
            self.tail.unassign()
        for key in open_:  # not read to the end: read again next time
            self.tailed_at[key] = None

    def final(self) -> int:
        """The exact count once writing stopped (a tail read of what moved since its last one,
        whatever the watermarks did); the run's first and last progress stay what the
        measurement saw."""
        first, last = self.first_at, self.last_at
        self.poll(force_tail=True)
        self.first_at, self.last_at = first, last
        return self.count

    def close(self) -> None:
        self.tail.close()
        self.admin = None  # its connections close with it, before the broker stops


class CommitMeter(_Progress):
    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS):
        super().__init__()
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                           "enable.auto.commit": False})  # never joins: reads commits only
        self.committed: dict = {}

    def poll(self) -> int:
        try:
            committed = self.c.committed(self.tps, timeout=5)
        except KafkaException:
            return self.count  # the group coordinator is not ready: the next tick asks again
        now = time.monotonic()  # when the answer came (see WatermarkMeter.poll)
        got = {tp.partition: max(0, tp.offset) for tp in committed}
        count = sum(got.values())
        if count > self.count:
            self._moved(now)
        self.committed, self.count = got, count
        return count

    def final(self) -> int:
        first, last = self.first_at, self.last_at
        self.poll()
        self.first_at, self.last_at = first, last
        return self.count

    def close(self) -> None:
        self.c.close()


def verify_distinct(bootstrap: str, topic: str, timeout: float = 120.0) -> dict:
    """Every record of `topic` read once: how many, and how many distinct by provenance."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-verify",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen, total, open_ = set(), 0, set(range(PARTITIONS))
    deadline = time.monotonic() + timeout
    try:
        while open_ and time.monotonic() < deadline:
            check_interrupted()
            for m in c.consume(5000, 0.5):
                err = m.error()
                if err is None:
                    h = dict(m.headers() or ())
                    seen.add((h.get("sourcePartition"), h.get("sourceOffset")))
                    total += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    open_.discard(m.partition())
    finally:
        c.close()
    return {"distinct": len(seen), "total": total, "complete_read": not open_}


def measure(meter, expected: int, proc, cpu, started: float, args, on_tick=None) -> dict:
    """Poll `meter` every args.meter_interval seconds until it counts `expected` records, the
    flow went idle (args.idle_timeout), nothing came (args.first_timeout) or `proc` died.

    CPU is snapshot whenever the count moved, so a run that ends idle (records lost) is charged
    the CPU used until its last progress, not the idle wait after it; the snapshot when the
    first records were seen gives the steady cost, startup left out."""
    out = {"cpu": cpu.snapshot()}
    snapped_at = None
    next_tick = time.monotonic()
    while True:
        check_interrupted()
        count = meter.poll()
        now = time.monotonic()
        if on_tick is not None:
            on_tick()
        if meter.last_at != snapped_at:
            out["cpu"] = cpu.snapshot()
            snapped_at = meter.last_at
            if "cpu_first" not in out:  # what startup cost: the steady figures leave it out
                out["cpu_first"], out["count_first"] = out["cpu"], count
        if count >= expected:
            return {**out, "ended": "complete"}
        if proc.poll() is not None:
            return {**out, "ended": f"process exited with {proc.returncode}"}
        if meter.last_at is None and now - started > args.first_timeout:
            return {**out, "ended": f"no record within {args.first_timeout:.0f} s"}
        if meter.last_at is not None and now - meter.last_at > args.idle_timeout:
            return {**out, "ended": f"idle for {args.idle_timeout:.0f} s"}
        next_tick += args.meter_interval
        time.sleep(max(0.0, next_tick - time.monotonic()))
