"""The source's metadata across the link (wire.KIND_METADATA): destination topics made and kept
like their sources (partition count, configs), the operator's pinned configs left alone. On
Apache Kafka and on Tansu."""

import json
import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, ResourceType)

from diode.link.linksim import Faults, FaultSettings
from tests.conftest import ROOT, client, committed_offsets, consume, create_topic, produce, \
    wait_for, write_topology


def configs(cluster, topic: str) -> dict:
    admin = AdminClient(client(cluster))
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        described = admin.describe_configs([resource])[resource].result(10)
    except KafkaException:
        return {}
    return {k: e.value for k, e in described.items()}


def partitions(cluster, topic: str) -> int:
    md = AdminClient(client(cluster)).list_topics(topic=topic, timeout=10).topics.get(topic)
    return 0 if md is None or md.error is not None else len(md.partitions)


def alter(cluster, topic: str, **values) -> None:
    admin = AdminClient(client(cluster))
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in values.items()])
    admin.incremental_alter_configs([resource])[resource].result(10)


def test_destination_topics_follow_their_source(tmp_path, start_brokers, broker_kind, launch):
    src, dst = start_brokers(broker_kind, "source", "destination")
    create_topic(src.bootstrap, "src", 3, {"cleanup.policy": "compact",
                                           "retention.ms": "86400000",
                                           "max.message.bytes": "2000000"})
    create_topic(src.bootstrap, "quiet", 2, {"retention.ms": "3600000"})  # never a record
    topo = write_topology(
        tmp_path, src.bootstrap, dst.bootstrap,
        sender={"topics": ["src", "quiet"]},
        receiver={"topic.configs": {"dst_src": {"max.message.bytes": "3000000"}}})
    diode = launch(topo)
    produce(src.bootstrap, "src", [{"key": b"k%d" % i, "value": b"v%d" % i, "partition": i % 3}
                                   for i in range(30)])
    assert len(consume(dst.bootstrap, "dst_src", 30)) == 30

    # made like the source: its partition count, its compaction, the pinned value kept
    wait_for(lambda: configs(dst.bootstrap, "dst_src").get("retention.ms") == "86400000", 30,
             "the source's retention on the destination")
    made = configs(dst.bootstrap, "dst_src")
    assert made["cleanup.policy"] == "compact"
    assert made["max.message.bytes"] == "3000000", made  # pinned: not the source's 2000000
    assert partitions(dst.bootstrap, "dst_src") == 3
    # a topic without records is made too
    wait_for(lambda: partitions(dst.bootstrap, "dst_quiet") == 2, 30, "dst_quiet made")
    wait_for(lambda: configs(dst.bootstrap, "dst_quiet").get("retention.ms") == "3600000", 30,
             "dst_quiet's retention")

    # changed while running: retention follows, the pinned setting stays
    alter(src.bootstrap, "src", retention_ms="172800000", max_message_bytes="2500000")
    wait_for(lambda: configs(dst.bootstrap, "dst_src").get("retention.ms") == "172800000", 30,
             "the source's new retention on the destination")
    assert configs(dst.bootstrap, "dst_src")["max.message.bytes"] == "3000000"
    wait_for(lambda: diode.metric("metadata_changes", "kafka_writer", reason="config") >= 1,
             10, "the change counted")
    assert diode.metric("metadata_refused", "kafka_writer", reason="pinned") >= 1

    if broker_kind == "kafka":
        # partitions raised to 6: the destination follows, and records of the new partitions
        # keep their partition numbers
        admin = AdminClient(client(src.bootstrap))
        admin.create_partitions([NewPartitions("src", 6)])["src"].result(30)
        wait_for(lambda: partitions(dst.bootstrap, "dst_src") == 6, 30,
                 "the destination's partitions raised to 6")
        produce(src.bootstrap, "src", [{"key": b"n%d" % p, "value": b"new", "partition": p}
                                       for p in range(3, 6)])
        landed = [m for m in consume(dst.bootstrap, "dst_src", 33) if m.value() == b"new"]
        assert sorted(m.partition() for m in landed) == [3, 4, 5]
    else:
        # Tansu has no CreatePartitions: the source's count cannot be raised there
        admin = AdminClient(client(src.bootstrap))
        try:
            admin.create_partitions([NewPartitions("src", 6)])["src"].result(30)
            raise AssertionError("Tansu raised a partition count: test it here too")
        except KafkaException as exc:
            assert "not supported" in str(exc)

    status = subprocess.run([sys.executable, "-m", "diode", "status", str(topo)],
                            capture_output=True, text=True, cwd=ROOT).stdout
    assert "metadata of src synced" in status, status
    assert diode.stop() == 0


def source_offsets(msgs) -> dict:
    """source partition -> the sourceOffset of each message, in order read."""
    out: dict = {}
    for m in msgs:
        h = dict(m.headers())
        out.setdefault(int(h["sourcePartition"]), []).append(int(h["sourceOffset"]))
    return out


def test_a_consumer_group_moves_to_the_low_side(tmp_path, brokers, link):
    """Group `app` read half of each partition on the source and committed. On the destination
    the same group resumes at the translated offsets: partition 1 at its other half exactly;
    partition 0, whose records 40..59 were lost on the link and committed at 50, at the first
    record after the commit point that arrived (60), reading nothing before it and skipping
    nothing after it."""
    src, dst = brokers
    create_topic(src.bootstrap, "src", 2)
    lk = link(Faults(FaultSettings()), sender={"groups": ["app.*"]})
    produce(src.bootstrap, "src", [{"value": b"%d" % i, "partition": 0} for i in range(40)] +
            [{"value": b"%d" % i, "partition": 1} for i in range(100)])
    assert len(consume(dst.bootstrap, "dst_src", 140)) == 140
    lk.sim.faults.s = FaultSettings(loss=1.0)  # the link down while 40..59 are sent
    produce(src.bootstrap, "src", [{"value": b"%d" % i, "partition": 0} for i in range(40, 60)])
    assert committed_offsets(src.bootstrap, "diode-test", "src", 2, [60, 100],
                             timeout=30) == [60, 100]
    lk.sim.faults.s = FaultSettings()
    produce(src.bootstrap, "src", [{"value": b"%d" % i, "partition": 0} for i in range(60, 100)])
    assert len(consume(dst.bootstrap, "dst_src", 180, idle=1.0)) == 180  # 40..59 never came

    app = Consumer(client(src.bootstrap, **{"group.id": "app"}))
    app.commit(offsets=[TopicPartition("src", 0, 50), TopicPartition("src", 1, 50)],
               asynchronous=False)
    app.close()
    # on the destination: the offsets of source records 60 (partition 0) and 50 (partition 1)
    assert committed_offsets(dst.bootstrap, "app", "dst_src", 2, [40, 50],
                             timeout=60) == [40, 50]

    low = Consumer(client(dst.bootstrap, **{
        "group.id": "app", "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "max.poll.interval.ms": 7000}))  # (Tansu joins slowly)
    low.subscribe(["dst_src"])
    read, deadline = [], time.monotonic() + 60
    while len(read) < 90 and time.monotonic() < deadline:
        read += [m for m in low.consume(100, timeout=0.5) if m.error() is None]
    low.close()
    assert source_offsets(read) == {0: list(range(60, 100)), 1: list(range(50, 100))}

    checkpoints = [json.loads(m.value()) for m in consume(dst.bootstrap, "diode-checkpoints",
                                                          2, timeout=30)]
    assert {(c["consumerGroupId"], c["partition"], c["upstreamOffset"], c["downstreamOffset"])
            for c in checkpoints} >= {("app", 0, 50, 40), ("app", 1, 50, 50)}
    status = subprocess.run([sys.executable, "-m", "diode", "status",
                             str(lk.receiver_topo)], capture_output=True, text=True,
                            cwd=ROOT).stdout
    assert "group app offsets synced" in status, status
