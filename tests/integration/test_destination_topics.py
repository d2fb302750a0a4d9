"""The receiver's destination topics at many topics (diode.kafka.preparer): the topics a writer
asks about together are learned from one metadata request and the missing ones created in one
CreateTopics request, each answered with its partition count; one the destination refuses is
answered with its error and the others of its batch are created all the same."""

import time
from typing import ClassVar

from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from diode.kafka import preparer
from diode.kafka.preparer import Preparer, TopicAnswer
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


def answers_to(kafka: dict, asked: dict, monkeypatch) -> dict:
    """topic -> its TopicAnswer, every one of `asked` ({topic: (partitions, config)}) asked
    before the Preparer's thread starts, as a writer asks when the first records of many
    topics come together."""
    CountingAdmin.creates, CountingAdmin.describes = [], []
    monkeypatch.setattr(preparer, "AdminClient", CountingAdmin)
    p = Preparer(kafka)
    for topic, (partitions, config) in asked.items():
        p.topic(topic, partitions, config)
    p.start()
    answers: dict = {}
    deadline = time.monotonic() + 60
    try:
        while len(answers) < len(asked) and time.monotonic() < deadline:
            answers.update((a.topic, a) for a in p.take() if isinstance(a, TopicAnswer))
            time.sleep(0.05)
    finally:
        p.close()
    return answers


def test_topics_asked_together_are_created_in_one_request_and_each_answered(
        start_brokers, broker_kind, monkeypatch):
    dst, = start_brokers(broker_kind, "destination")
    create_topic(dst.bootstrap, "there.already", 3)
    asked = {f"dest.{i:03d}": (3, None) for i in range(60)}
    asked["there.already"] = (3, None)
    answers = answers_to(dst.client_config(), asked, monkeypatch)
    assert set(answers) == set(asked)
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
