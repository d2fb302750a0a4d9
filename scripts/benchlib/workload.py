"""The source topics and the records pre-produced to them before anything is timed."""

import os
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .resources import check_interrupted

PARTITIONS = 4
SIZES = {"small": 100, "large": 10 * 1024}


@dataclass
class Source:
    """One record size's source: its broker and topic, pre-produced with `count` records."""
    size_name: str
    value_size: int
    count: int
    broker: object  # diode.kafka.brokers.EmbeddedBroker
    topic: str
    ends: dict      # partition -> end offset (from the delivery reports)


def make_value(size: int, compressible: bool) -> bytes:
    if not compressible:
        return os.urandom(size)
    # About 2:1 under zstd: half random bytes, half a repeated pattern.
    half = size // 2
    return os.urandom(half) + (b"diode-bench-" * (size // 12 + 1))[:size - half]


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions)], operation_timeout=10).values():
        fut.result()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} did not appear on {bootstrap}")


def preproduce(bootstrap: str, topic: str, count: int, size: int,
               compressible: bool, null_keys: bool = False) -> tuple[float, dict]:
    """Produce `count` records (a key and one header each; with `null_keys`, as a producer does
    by default: no key, no header) to a new topic. Returns the seconds it
    took and each partition's end offset, from the delivery reports: exact on every broker
    (Tansu's "latest" offset is not, docs/design.md §8). Fails unless all are acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all",
                  "batch.size": 1000000, "queue.buffering.max.kbytes": 262144,
                  "compression.type": "none"})
    failed = []
    ends = {part: 0 for part in range(PARTITIONS)}

    def delivered(err, msg):
        if err is not None:
            failed.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    t0 = time.monotonic()
    for i in range(count):
        if i % 1000 == 0:
            check_interrupted()
        value = make_value(size, compressible)
        while True:
            try:
                if null_keys:
                    p.produce(topic, value=value, on_delivery=delivered)
                else:
                    p.produce(topic, value=value, key=b"key-%d" % i,
                              headers=[("bench", b"%d" % i)], on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left or failed:
        raise RuntimeError(f"pre-producing {topic}: {left} record(s) unconfirmed, "
                           f"{len(failed)} failed ({failed[:1]})")
    if sum(ends.values()) != count:
        raise RuntimeError(f"pre-producing {topic}: the end offsets add up to "
                           f"{sum(ends.values())}, not {count}: is the topic new?")
    return time.monotonic() - t0, ends


def warm_up_offsets(bootstrap: str, topic: str, timeout: float = 60.0) -> None:
    """Commit an offset once for a throwaway group, so that the broker's offsets topic exists
    before a timed run commits (Apache Kafka creates __consumer_offsets, 50 partitions, on the
    first use: seconds that the first system measured would otherwise pay alone)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-warm-up",
                  "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()
