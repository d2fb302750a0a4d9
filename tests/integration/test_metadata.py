"""The source's metadata across the link (wire.KIND_METADATA): destination topics made and kept
like their sources (partition count, configs), the operator's pinned configs left alone. On
Apache Kafka and on Tansu."""

import subprocess
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   NewPartitions, ResourceType)

from tests.conftest import ROOT, client, consume, create_topic, produce, wait_for, \
    write_topology


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
