"""The receiver's destination topics at many topics (diode.kafka.preparer): the topics a writer
asks about together are learned from one metadata request and the missing ones created in one
CreateTopics request, each answered with its partition count; one the destination refuses is
answered with its error and the others of its batch are created all the same."""

import time
from types import SimpleNamespace
from typing import ClassVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from diode.kafka import metasync, preparer
from diode.kafka.metasync import MetadataSync
from diode.kafka.preparer import PartitionsReady, Preparer, TopicAnswer
from diode.kafka.refresh import topic_configs
from tests.conftest import create_topic, only_on, topics


class CountingAdmin(AdminClient):
    """An admin client that keeps the topics of each CreateTopics and DescribeTopics it sends."""
    creates: ClassVar[list] = []
    describes: ClassVar[list] = []

    def create_topics(self, new_topics, **kwargs):
        CountingAdmin.creates.append(sorted(t.topic for t in new_topics))
        return super().create_topics(new_topics, **kwargs)

    def describe_topics(self, collection, **kwargs):
        CountingAdmin.describes.append(sorted(collection.topic_names))
        return super().describe_topics(collection, **kwargs)


def answers_to(kafka: dict, asked: dict, monkeypatch, hosted=None) -> dict:
    """topic -> its TopicAnswer, every one of `asked` ({topic: (partitions, config)}) asked
    before the Preparer's thread starts, as a writer asks when the first records of many
    topics come together, taken until every partition answered unready is answered ready
    (PartitionsReady); with `hosted` (a dict), (topic, partition) -> whether the destination
    took records for it (answered ListOffsets) when it was answered ready."""
    CountingAdmin.creates, CountingAdmin.describes = [], []
    monkeypatch.setattr(preparer, "AdminClient", CountingAdmin)
    # (a loaded machine's broker may take longer than READY_SECONDS to make 180 partitions)
    monkeypatch.setattr(preparer, "READY_SECONDS", 150.0)
    p = Preparer(kafka)
    for topic, (partitions, config) in asked.items():
        p.topic(topic, partitions, config)
    p.start()
    answers: dict = {}
    unready: set = set()
    deadline = time.monotonic() + 180
    try:
        while (len(answers) < len(asked) or unready) and time.monotonic() < deadline:
            ready = set()
            for a in p.take():
                if isinstance(a, TopicAnswer):
                    answers[a.topic] = a
                    ready |= {(a.topic, n) for n in range(a.partitions) if n not in a.unready}
                    unready |= {(a.topic, n) for n in a.unready}
                elif isinstance(a, PartitionsReady):
                    assert {(a.topic, n) for n in a.partitions} <= unready
                    ready |= {(a.topic, n) for n in a.partitions}
            unready -= ready
            if hosted is not None and ready:
                hosted.update(taking(kafka, ready))
            time.sleep(0.05)
    finally:
        p.close()
    assert not unready
    return answers


def taking(kafka: dict, partitions: set) -> dict:
    """(topic, partition) -> whether it answers ListOffsets now (its leader has made its log:
    a producer's records to it are taken, not refused and retried)."""
    admin = AdminClient(kafka)
    futures = admin.list_offsets({TopicPartition(t, n): OffsetSpec.latest()
                                  for t, n in partitions}, request_timeout=10)
    out = {}
    for tp, future in futures.items():
        try:
            future.result(15)
            out[(tp.topic, tp.partition)] = True
        except KafkaException:
            out[(tp.topic, tp.partition)] = False
    return out


def test_topics_asked_together_are_created_in_one_request_and_each_answered(
        start_brokers, broker_kind, monkeypatch):
    """... and each answered once in the metadata, its partitions each answered ready once
    its leader takes records: Apache Kafka names a new partition's leader before the leader
    has made its log, and refuses records meanwhile."""
    dst, = start_brokers(broker_kind, "destination")
    create_topic(dst.bootstrap, "there.already", 3)
    asked = {f"dest.{i:03d}": (3, None) for i in range(60)}
    asked["there.already"] = (3, None)
    hosted: dict = {}
    answers = answers_to(dst.client_config(), asked, monkeypatch, hosted)
    assert set(answers) == set(asked)
    assert len(hosted) == 61 * 3 and [tp for tp, ok in hosted.items() if not ok] == []
    assert all(a.partitions == 3 and a.error is None for a in answers.values())
    assert [t for t, a in answers.items() if not a.created] == ["there.already"]
    # one CreateTopics of the 60 missing, after one metadata request of all 61
    assert CountingAdmin.creates == [sorted(t for t in asked if t != "there.already")]
    assert CountingAdmin.describes[0] == sorted(asked)
    held = topics(dst.bootstrap)
    assert all(held.get(t) == 3 for t in asked)


@only_on("kafka")  # (Tansu creates a topic of any name and config: it refuses none of these)
def test_a_topic_refused_in_a_batch_is_answered_with_its_error_and_the_others_created(
        start_brokers, broker_kind, monkeypatch):
    dst, = start_brokers(broker_kind, "destination")
    asked = {f"dest.{i:03d}": (2, None) for i in range(20)}
    asked["bad name!"] = (2, None)
    asked["dest.badconfig"] = (2, {"cleanup.policy": "nonsense"})
    answers = answers_to(dst.client_config(), asked, monkeypatch)
    assert set(answers) == set(asked)
    assert len(CountingAdmin.creates) == 1
    assert answers["bad name!"].partitions == 0
    assert answers["bad name!"].error.code() == KafkaError.TOPIC_EXCEPTION
    assert answers["dest.badconfig"].error.code() == KafkaError.INVALID_CONFIG
    good = {t: a for t, a in answers.items() if t.startswith("dest.0")}
    assert all(a.partitions == 2 and a.created and a.error is None for a in good.values())
    held = topics(dst.bootstrap)
    assert all(held.get(t) == 2 for t in good) and "dest.badconfig" not in held


def test_the_topics_of_a_metadata_look_are_created_in_one_request_as_each_would_be(
        start_brokers, monkeypatch):
    """The receiver's MetadataSync creates the destination topics the sender's look names
    (before their records come) in one CreateTopics request, each with its source's partition
    count and configs, the operator's pins winning, its rename kept; each reported created."""
    dst, = start_brokers("tansu", "destination")
    create_topic(dst.bootstrap, "d.there", 2)
    CountingAdmin.creates, CountingAdmin.describes = [], []
    monkeypatch.setattr(metasync, "AdminClient", CountingAdmin)
    r = SimpleNamespace(topic_configs={"*": {"retention.ms": "600000"},
                                       "d.s01": {"max.message.bytes": "3000000"}},
                        sync_topic_configs=True, sync_topic_configs_allow=[],
                        sync_topic_configs_deny=[], sync_group_offsets=False,
                        group_checkpoints_topic="")
    names = {"s01": "d.s01", "there": "d.there", **{f"s{i:02d}": f"d.s{i:02d}"
                                                     for i in range(2, 30)}}
    sync = MetadataSync(dst.client_config(), r, names.__getitem__).start()
    look = {topic: (b"id", 1 + i % 3, {"retention.ms": "86400000",
                                        "max.message.bytes": "2000000"})
            for i, topic in enumerate(sorted(names))}
    reports: list = []
    try:
        sync.hand(look, {})
        deadline = time.monotonic() + 60
        while sync.busy and time.monotonic() < deadline:
            reports += sync.take()
            time.sleep(0.05)
    finally:
        sync.close()
    created = {rep.name for rep in reports for reason, _ in rep.done if reason == "created"}
    assert created == set(names) - {"there"}
    assert CountingAdmin.creates == [sorted(set(names.values()) - {"d.there"})]
    held = topics(dst.bootstrap)
    assert all(held.get(names[t]) == n for t, (_, n, _) in look.items() if t != "there")
    assert held["d.there"] == 2
    made = topic_configs(AdminClient(dst.client_config()), ["d.s01", "d.s02"],
                         ["retention.ms", "max.message.bytes"])
    assert made["d.s01"] == {"retention.ms": "600000", "max.message.bytes": "3000000"}
    assert made["d.s02"] == {"retention.ms": "600000", "max.message.bytes": "2000000"}
