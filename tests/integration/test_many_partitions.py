"""A thousand partitions (issue 36): 20 source topics of 50 partitions each, chosen by
sender.topics.regex, every record accounted for by its source topic, partition and offset.

Records go to the partitions in turn (record i to partition i mod 1 000 in the order
topic-major: t000[0], t001[0], ..., t019[0], t000[1], ...), so that any few consecutive records
touch as many topics as records: the case where records are spread thinnest.

Where the time goes (Tansu, measured with this module's own print on the shared machine,
2026-11-27, load average 3 to 17): its cost is the topics, not the partitions nor the records.
A kafka_writer that starts reads what the destination holds of each source topic before the
topic's first record (diode.writer.recovery), one topic at a time on its Preparer's thread,
0.7 to 1 s a topic under load; with 200 topics of 5 that was 75 s to the first phase's last
record and 163 s after the restart to account for the stream (the missing-records topic's
creation waited 85 s behind the topics' reads): 256 to 267 s in all, where creating the
topics and producing took 1.3 s and reading the destination back 3 to 5 s. 20 topics of 50
hold the same 1 000 partitions at a tenth of those reads (the bench, ./scripts/bench
--partitions 1000, keeps 200 topics of 5). The source's and the destination's topics are made
in batched CreateTopics requests before the launch; the missing-records topic is left to the
receiver (a writer reads it, existing, with its first question about each topic: an empty one
made beforehand cost minutes on Tansu).

Both brokers hold 1 000 partitions, but the test runs on Tansu alone in ./scripts/test: an
Apache Kafka broker makes each partition's log after answering the CreateTopics request, at
75 ms a partition under load and ~3 a second under a load of 58 (its log: "Creating new
partition"), the destination's as long again, past what the suite's 40 minutes leave."""

import time
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from diode.kafka.clients import create_topics

from tests.conftest import client, missing_event, only_on, produce, read_until, wait_for
from tests.integration.test_durability import Stream, durable_topology

TOPICS, PER_TOPIC = 20, 50
PARTITIONS = TOPICS * PER_TOPIC
FIRST, STREAMED = 2, 5   # records per partition there before the launch, then streamed
REGEX = r"t[0-9]{3}"


def topic(t: int) -> str:
    return "t%03d" % t


def where(i: int) -> tuple[str, int]:
    """The source topic and partition of record i."""
    k = i % PARTITIONS
    return topic(k % TOPICS), k // TOPICS


def make_topics(src: str, dst: str, timeout: float = 600) -> None:
    """The source's topics, and the destination's copies of them that the receiver would
    create, in batched CreateTopics requests
    (diode.kafka.clients.create_topics) before anything is launched; then until every source
    partition's leader answers for it (a Kafka broker makes each partition's log after the
    request is answered: 75 ms a partition on this machine under load, ~3 a second at its
    worst). The receiver's creation of many topics is the bench's and
    test_destination_topics' to measure: here it would only be waited for."""
    for bootstrap, wanted in ((src, {topic(t): (PER_TOPIC, None) for t in range(TOPICS)}),
                              (dst, {"dst_" + topic(t): (PER_TOPIC, None)
                                     for t in range(TOPICS)})):
        made = create_topics(AdminClient(client(bootstrap)), wanted, timeout=60)
        assert all(v is True for v in made.values()), \
            [(t, v) for t, v in made.items() if v is not True][:5]
    admin = AdminClient(client(src))
    waiting = [TopicPartition(topic(t), p) for t in range(TOPICS) for p in range(PER_TOPIC)]
    deadline = time.monotonic() + timeout
    while waiting:
        assert time.monotonic() < deadline, f"{len(waiting)} partitions not ready: {waiting[:5]}"
        asked = admin.list_offsets({tp: OffsetSpec.earliest() for tp in waiting},
                                   request_timeout=30)
        waiting = [tp for tp, fut in asked.items() if fut.exception(30) is not None]
        if waiting:
            time.sleep(1)


def records(start: int, end: int) -> list:
    """Records start..end-1, each naming its topic and partition in its value."""
    out = []
    for i in range(start, end):
        name, p = where(i)
        out.append({"value": b"%s/%d/r%07d" % (name.encode(), p, i), "partition": p,
                    "topic": name})
    return out


def expected(total: int) -> Counter:
    """(topic, partition) -> how many records of the first `total` went there."""
    return Counter(where(i) for i in range(total))


@dataclass
class Audit:
    """What the destination holds of the source's records, by (topic, partition, offset)."""
    written: Counter = field(default_factory=Counter)  # (t, p, offset) -> copies
    values: dict = field(default_factory=dict)         # (t, p, offset) -> value
    misplaced: list = field(default_factory=list)      # provenance that disagrees
    missing: dict = field(default_factory=dict)        # (t, p, offset) -> reasons
    events: list = field(default_factory=list)

    def take(self, m) -> None:
        if m.topic() == "missing":
            e, offsets = missing_event(m)
            self.events.append(e)
            for o in offsets:
                self.missing.setdefault((e["sourceTopic"], e["sourcePartition"], o),
                                        []).append(e["reason"])
            return
        h = dict(m.headers())
        key = (h["sourceTopic"].decode(), int(h["sourcePartition"]), int(h["sourceOffset"]))
        self.written[key] += 1
        self.values[key] = m.value()
        name, p = m.value().split(b"/")[:2]
        if (m.topic(), m.partition()) != ("dst_" + key[0], key[1]) or \
                (name.decode(), int(p)) != key[:2]:
            self.misplaced.append((m.topic(), m.partition(), key, m.value()))

    def silent(self, counts: Counter) -> set:
        """Source records neither written nor reported missing."""
        return {(t, p, o) for (t, p), n in counts.items() for o in range(n)} - \
            set(self.written) - set(self.missing)

    def extra(self, counts: Counter) -> set:
        """Written records that are no source record."""
        return {k for k in self.written if k[2] >= counts.get(k[:2], 0)}

    @property
    def duplicates(self) -> list:
        return [k for k, n in self.written.items() if n > 1]

    @property
    def false_missing(self) -> set:
        return set(self.written) & set(self.missing)

    @property
    def reported_twice(self) -> list:
        return [k for k, reasons in self.missing.items() if len(reasons) > 1]

    def summary(self, counts: Counter) -> str:
        silent = sorted(self.silent(counts))
        return (f"written {len(self.written)}, missing {len(self.missing)}, silent "
                f"{len(silent)} {silent[:10]}, false missing "
                f"{sorted(self.false_missing)[:10]}, duplicates {self.duplicates[:10]}, "
                f"misplaced {self.misplaced[:5]}, extra {sorted(self.extra(counts))[:5]}, "
                f"events {len(self.events)} {self.events[:10]}")


def audit(dst: str, counts: Counter, timeout: float, idle: float = 3.0) -> Audit:
    """Read every destination topic (and the missing-records topic) until each source record
    is written or reported (then `idle` seconds more, for extras), or `timeout`."""
    a = Audit()
    read_until(dst, ["dst_" + topic(t) for t in range(TOPICS)] + ["missing"], a.take,
               lambda: not a.silent(counts), timeout, idle)
    return a


def once_or_reported(a: Audit, counts: Counter, receiver) -> str:
    """Every source record written once where it belongs, or reported missing and not
    written; nothing written that is no source record. The receiver's log."""
    out = receiver.output()
    assert not a.silent(counts), f"lost silently: {a.summary(counts)}\n{out[-5000:]}"
    assert not a.duplicates, f"written twice: {a.summary(counts)}"
    assert not a.misplaced, f"in the wrong place: {a.summary(counts)}"
    assert not a.extra(counts), f"records of no source offset: {a.summary(counts)}"
    assert not a.false_missing, f"written yet reported missing: {a.summary(counts)}"
    return out


@only_on("tansu")  # (Apache Kafka's partition creation alone is minutes: see the module)
def test_a_thousand_partitions_every_record_once_and_a_receiver_restart_accounted_exactly(
        tmp_path, brokers, launch):
    """Two phases on the same 1 000 partitions, one launch of the sender (their creation and
    the launch are most of the cost: one test, not two). First, FIRST records in each
    partition, there before the sender starts: each arrives once, in the destination topic and
    partition of its source, every offset of every partition exactly once, nothing reported
    missing. Then records stream over all the partitions while the whole receiver side is
    stopped (SIGTERM) and started again: every record is in the destination once, or reported
    missing (receiver-down) once and then not written; none lost unreported, none reported that
    arrived; no more reported than the stream produced while the receiver was away."""
    src, dst = brokers
    first, total, rate = FIRST * PARTITIONS, (FIRST + STREAMED) * PARTITIONS, 500
    began = time.monotonic()
    make_topics(src.bootstrap, dst.bootstrap)
    produce(src.bootstrap, None, records(0, first))
    topo = durable_topology(tmp_path, src, dst,
                            sender={"topics": [], "topics.regex": [REGEX]})
    made = time.monotonic()
    receiver = launch(topo, side="receiver", workers=5)
    sender = launch(topo, side="sender", workers=3)
    launched = time.monotonic()
    wait_for(lambda: receiver.metric("records", "kafka_writer") >= first, 240,
             f"every record written\n{receiver.output()[-3000:]}")
    copied = time.monotonic()
    counts = expected(first)
    a = audit(dst.bootstrap, counts, timeout=120, idle=1.0)
    out = once_or_reported(a, counts, receiver)
    assert not a.missing, f"reported missing: {a.summary(counts)}\n{out[-5000:]}"
    assert len(counts) == PARTITIONS and set(counts.values()) == {FIRST}
    # the values are the records produced to each offset's partition, each once
    assert sorted(a.values.values()) == sorted(r["value"] for r in records(0, first))
    audited = time.monotonic()

    stream = Stream(src.bootstrap, total, rate, first=first, topic=None, batch=records,
                    timeout=180).start()
    time.sleep(2)  # (records of the stream cross before the receiver goes)
    went = time.monotonic()
    assert receiver.stop() == 0
    time.sleep(2)  # (the outage under test: the sender sends, nothing receives)
    receiver = launch(topo, side="receiver", workers=5)
    back = time.monotonic()
    stream.join()
    counts = expected(total)
    a = audit(dst.bootstrap, counts, timeout=180)
    print(f"\n{PARTITIONS} partitions ({TOPICS} topics): topics made and {first} produced in "
          f"{made - began:.1f} s, both sides launched in {launched - made:.1f} s, written in "
          f"{copied - launched:.1f} s, read back in {audited - copied:.1f} s; receiver away "
          f"{back - went:.1f} s, all accounted for {time.monotonic() - back:.1f} s after it "
          f"was back: {len(a.written)} written, {len(a.missing)} reported missing")
    out = once_or_reported(a, counts, receiver)
    assert not a.reported_twice, f"reported twice: {a.reported_twice[:5]}"
    assert a.missing, "records sent while the receiver was down cannot have arrived"
    assert {r for reasons in a.missing.values() for r in reasons} == {"receiver-down"}, \
        ([e for e in a.events if e.get("reason") != "receiver-down"], out[-8000:])
    assert len(a.missing) <= stream.produced_between(went - 2, back), a.summary(counts)
    assert sender.stop() == 0 and receiver.stop() == 0
