"""What diode is compared with: the simplest process that does the same Kafka work, one per
mode, each a subprocess mode of bench.py measured exactly as diode is.

- `_relay SRC DST TOPIC DEST_TOPIC COUNT` (e2e): consume -> produce in one process, the
  record's key, value, timestamp and headers plus the provenance headers, to the same partition.
- `_relay_many SRC DST SPEC PREFIX COUNT` (--partitions): the same over every topic of SPEC (a
  JSON file: name -> partitions), each to PREFIX + its name.
- `_consume SRC TOPIC GROUP COUNT COMMIT_MS` (sender alone): reads the topic from the beginning
  in consume(1000) batches, touches each message's key, value and headers, and commits its
  positions every COMMIT_MS and at the end, as diode's kafka_reader does.
- `_produce SRC DST TOPIC DEST_TOPIC COUNT` (receiver alone): loads the source records into
  memory, prints `ready`, and on `go` (stdin) produces them with the provenance headers, as
  the kafka_writer writes them.

Producers use diode's own producer settings (diode.kafka.clients.producer_config). Every baseline
stays after its work until SIGTERM, so the bench reads its CPU time as it does diode's.
"""

import json
import select
import signal
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from diode.kafka.clients import producer_config

from .workload import PARTITIONS

TOPIC_ID = b"AQIDBAUGBwgJCgsMDQ4PEA"  # an incarnation's text (sourceTopicId), 22 bytes
MANY_IDLE_SECONDS = 300.0  # _relay_many's wait for a record before it ends short


def _consumer(bootstrap: str, topic: str, group: str = "bench-baseline",
              topics: dict | None = None) -> Consumer:
    """A consumer of every partition of `topic` (or of `topics`: name -> partitions) from the
    beginning."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    topics = topics or {topic: PARTITIONS}
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, n in topics.items()
              for p in range(n)])
    return c


def _batches(c: Consumer, count: int, timeout: float = 0.1, idle: float = 30.0):
    """`c`'s records in consume batches of up to 1000 (errors left out), until `count` were
    given or nothing came for `idle` seconds."""
    given = 0
    idle_since = time.monotonic()
    while given < count and time.monotonic() - idle_since < idle:
        msgs = c.consume(1000, timeout)
        if msgs:
            idle_since = time.monotonic()
            msgs = [m for m in msgs if m.error() is None]
            given += len(msgs)
            yield msgs


def _produce(p: Producer, topic: str, m_or_record, headers) -> None:
    value, key, partition, ts = m_or_record
    kw = {"timestamp": ts} if ts else {}
    while True:
        try:
            p.produce(topic, value=value, key=key, headers=headers, partition=partition, **kw)
            return
        except BufferError:
            p.poll(0.05)


def _provenance(topic: str, partition: int, offset: int) -> list:
    """The provenance diode writes (the incarnation's text a constant: its length is the
    cost)."""
    return [("sourceTopic", topic.encode()), ("sourcePartition", str(partition).encode()),
            ("sourceOffset", str(offset).encode()), ("sourceTopicId", TOPIC_ID)]


def _stay(ok: bool) -> int:
    """Stay until the bench has measured the run and read our CPU time, as diode does."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0 if ok else 1))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 0 if ok else 1


def relay_main(argv) -> int:
    """The e2e baseline: one process, consume -> produce, the same headers plus provenance."""
    src, dst, topic, dest_topic, count = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    c = _consumer(src, topic, "bench-relay")
    return _relay(c, dst, lambda _: dest_topic, count)


def relay_many_main(argv) -> int:
    """The relay of --partitions: every topic of a JSON file (name -> partitions), each to
    PREFIX + its name, the same partition."""
    src, dst, spec, prefix, count = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    with open(spec) as f:
        topics = json.load(f)
    c = _consumer(src, "", "bench-relay", topics)
    # over 10 000 partitions of Tansu at load 45 its consumer went 30 s without a record
    # (16 345 of 50 000 relayed): it waits as long as the bench's --idle-timeout with
    # --partitions
    return _relay(c, dst, lambda t: prefix + t, count, idle=MANY_IDLE_SECONDS)


def _relay(c: Consumer, dst: str, dest_of, count: int, idle: float = 30.0) -> int:
    p = Producer(producer_config({"bootstrap.servers": dst}))  # the kafka_writer's settings
    done = 0
    for msgs in _batches(c, count, idle=idle):
        for m in msgs:
            headers = list(m.headers() or ()) + _provenance(m.topic(), m.partition(), m.offset())
            ts_type, ts = m.timestamp()
            _produce(p, dest_of(m.topic()),
                     (m.value(), m.key(), m.partition(), ts if ts_type else 0), headers)
        done += len(msgs)
        p.poll(0)
    left = p.flush(300)  # a destination of thousands of partitions on a loaded machine is slow
    c.close()
    print(f"relayed {done} record(s), {left} unconfirmed", flush=True)
    return _stay(done >= count and not left)


def consume_main(argv) -> int:
    """The sender-alone baseline: a plain consumer, committing as it goes."""
    src, topic, group, count, commit_ms = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    c = _consumer(src, topic, group)
    done = touched = 0
    next_commit = time.monotonic() + commit_ms / 1000
    for msgs in _batches(c, count):
        for m in msgs:
            touched += len(m.key() or b"") + len(m.value() or b"") + len(m.headers() or ())
            m.timestamp()
        done += len(msgs)
        if time.monotonic() >= next_commit:
            c.commit(asynchronous=True)  # the positions of everything consumed
            next_commit = time.monotonic() + commit_ms / 1000
    c.commit(asynchronous=False)
    print(f"consumed {done} record(s) ({touched} key/value bytes and headers)", flush=True)
    ok = done >= count
    c.close()
    return _stay(ok)


def produce_main(argv) -> int:
    """The receiver-alone baseline: the source records from memory to the destination."""
    src, dst, topic, dest_topic, count = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    c = _consumer(src, topic)
    records = []  # (value, key, partition, timestamp, headers, offset)
    for msgs in _batches(c, count, timeout=0.5):
        for m in msgs:
            ts_type, ts = m.timestamp()
            records.append((m.value(), m.key(), m.partition(), ts if ts_type else 0,
                            m.headers() or [], m.offset()))
    c.close()
    p = Producer(producer_config({"bootstrap.servers": dst}))  # the kafka_writer's settings
    p.list_topics(dest_topic, timeout=10)  # metadata before the clock starts, as diode's writer
    print(f"ready {len(records)} records", flush=True)
    while not select.select([sys.stdin], [], [], 0.2)[0]:
        pass
    if sys.stdin.readline().strip() != "go":
        return 1
    t0 = time.monotonic()
    for i, (value, key, partition, ts, headers, offset) in enumerate(records):
        _produce(p, dest_topic, (value, key, partition, ts),
                 list(headers) + _provenance(topic, partition, offset))
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(60)
    print(f"produced {len(records)} record(s) in {time.monotonic() - t0:.2f} s, {left} "
          "unconfirmed", file=sys.stderr, flush=True)
    return _stay(len(records) >= count and not left)


def live_main(argv) -> int:
    """--live's traffic: produce the records to the (new) source topic at full speed, once."""
    from .workload import preproduce
    bootstrap, topic, count, size, compressible, null_keys = argv[0], argv[1], int(argv[2]), \
        int(argv[3]), argv[4] == "1", argv[5] == "1"
    seconds, _ = preproduce(bootstrap, topic, count, size, compressible, null_keys)
    print(f"produced {count} record(s) in {seconds:.1f} s", flush=True)
    return 0
