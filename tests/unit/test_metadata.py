"""The source's metadata: what the sender sends when, what the receiver applies (the pure parts;
tests/integration/test_metadata.py runs them against brokers)."""

import pytest

from diode.errors import RejectedDatagram
from diode.kafka import metadata
from diode.kafka.metadata import Look, MetadataWatcher, Sent
from diode.kafka.metasync import pins, target_configs
from diode.link import wire

A, B = b"a" * 16, b"b" * 16


def look(topics: dict, groups: dict | None = None) -> Look:
    return Look("cluster", topics, groups or {}, None, 1000)


def test_only_what_changed_is_sent_between_whole_sends():
    sent = Sent()
    first = look({"t": (A, 3, {"retention.ms": "1"}), "u": (B, 1, {})}, {("g", "t", 0): 5})
    assert sent.changes(first, whole=False) == (
        [("t", A, 3, {"retention.ms": "1"}), ("u", B, 1, {})], [("g", "t", 0, A, 5)])
    sent.sent(first)
    assert sent.changes(first, whole=False) == ([], [])
    # a config changed, a group moved on: only those
    second = look({"t": (A, 3, {"retention.ms": "2"}), "u": (B, 1, {})}, {("g", "t", 0): 9})
    assert sent.changes(second, whole=False) == ([("t", A, 3, {"retention.ms": "2"})],
                                                 [("g", "t", 0, A, 9)])
    sent.sent(second)
    # the whole send names everything again
    topics, groups = sent.changes(second, whole=True)
    assert [t[0] for t in topics] == ["t", "u"] and len(groups) == 1
    # a topic recreated (another incarnation) is a change, with its groups' offsets
    third = look({"t": (B, 3, {"retention.ms": "2"}), "u": (B, 1, {})}, {("g", "t", 0): 9})
    assert sent.changes(third, whole=False) == ([("t", B, 3, {"retention.ms": "2"})],
                                                [("g", "t", 0, B, 9)])


def test_pinned_configs_win_and_the_lists_filter():
    pinned = pins({"*": {"retention.ms": 7}, "dst_t": {"max.message.bytes": "3"}}, "dst_t")
    assert pinned == {"retention.ms": "7", "max.message.bytes": "3"}
    source = {"retention.ms": "1", "max.message.bytes": "3", "cleanup.policy": "compact",
              "compression.type": "lz4"}
    target, refused = target_configs(source, pinned, [], ["compression.type"], True)
    assert target == {"retention.ms": "7", "max.message.bytes": "3",
                      "cleanup.policy": "compact"}
    # a pinned config the source holds at the pinned value is no refusal
    assert refused == [("denied", "compression.type", "lz4"), ("pinned", "retention.ms", "1")]
    target, _ = target_configs(source, {}, ["cleanup.policy"], [], True)
    assert target == {"cleanup.policy": "compact"}
    # sync off: the pinned configs only, nothing said of the source's
    assert target_configs(source, pinned, [], [], False) == (pinned, [
        ("pinned", "retention.ms", "1")])


def test_metadata_crosses_the_wire_whole_and_a_damaged_one_is_rejected():
    meta = {"reader": 0, "time_ms": 5, "cluster": "c", "whole": True,
            "topics": [("t", A, 3, {"cleanup.policy": "compact"})],
            "groups": [("g", "t", 2, A, 41)]}
    payload = wire.encode_metadata(meta)
    assert wire.decode_metadata(payload) == meta
    with pytest.raises(RejectedDatagram):
        wire.decode_metadata(payload[:-3])
    with pytest.raises(RejectedDatagram):
        wire.decode_metadata(payload + b"\x00")


def test_a_group_offset_past_what_arrived_waits_before_it_is_committed(monkeypatch):
    """A committed offset past every record of its partition that arrived (caught up, or the
    records after it still on their way) is committed only once seen so for
    AHEAD_SETTLE_SECONDS; one with a record at or after it at once; one applied is not
    translated again."""
    from diode.kafka import groups, metasync
    from diode.runtime.topology import from_dict

    t = from_dict({"security": {"password.env": "X", "salt": "s"},
                   "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
                   "receiver": {"kafka": {"bootstrap.servers": "x:1"}, "topic.prefix": "d_",
                                "group.checkpoints.topic": ""}})
    sync = metasync.MetadataSync({}, t.receiver, lambda topic: "d_" + topic)
    clock, asked, committed = [100.0], [], []

    def translate(settings, dest, partition, incarnation, offsets, timeout):
        asked.append((dest, partition, offsets[0]))
        out = groups.Translated({offsets[0]: 40 if partition == 0 else 90})
        out.ahead = frozenset() if partition == 0 else frozenset(offsets)
        return out

    def apply(admin, group, offsets, timeout):
        committed.append(dict(offsets))
        return groups.Applied(committed=dict(offsets))

    monkeypatch.setattr(metasync.groups, "translate", translate)
    monkeypatch.setattr(metasync.groups, "apply", apply)
    monkeypatch.setattr(metasync.time, "monotonic", lambda: clock[0])
    entries = {("t", 0): (A, 60), ("t", 1): (A, 100)}
    report = sync._group(None, "app", entries)
    assert committed == [{("d_t", 0): 40}]  # partition 1's offset waits
    assert [reason for reason, _ in report.done] == ["group_commit"]
    clock[0] += metasync.AHEAD_SETTLE_SECONDS - 1
    sync._group(None, "app", entries)
    assert committed[1:] == []  # not yet; partition 0 not asked again
    assert asked.count(("d_t", 0, 60)) == 1
    clock[0] += 2
    sync._group(None, "app", entries)
    assert committed[1:] == [{("d_t", 1): 90}]
    # moved on meanwhile: waits afresh
    sync._group(None, "app", {("t", 1): (A, 120)})
    clock[0] += 2
    sync._group(None, "app", {("t", 1): (A, 120)})
    assert len(committed) == 2


def test_a_look_describes_the_configs_of_new_topics_at_once_and_of_the_others_in_turn():
    """Reader 0's metadata watcher described every topic's configs at every look (every 5 s;
    Apache Kafka answers with a topic's 33 configs whichever are asked): at 200 topics the
    largest cost of an idle sender's looks. Now a new or recreated topic's are described at
    once, the others' in turn, each within CONFIG_TURN_LOOKS looks; the look names them all."""
    from tests.unit.test_partial_looks import Listed, Said, Uuid, answered

    class Cluster(Listed):
        ids: dict = {}

        def describe_topics(self, topics, request_timeout=None):
            return {t: answered(Said(topic_id=Uuid(self.ids.get(t, 1))))
                    for t in topics.topic_names}

    cluster = Cluster({f"t{n}": 1 for n in range(12)})
    w = MetadataWatcher({}, lambda t: True, ["retention.ms"], [], 5.0)
    first = w.look(cluster)
    assert cluster.settings_asked() == set(cluster.topics) and set(first.topics) == set(
        cluster.topics)
    # later looks: 12 / CONFIG_TURN_LOOKS topics each, every topic within the turn; a config
    # changed on the source is seen
    cluster.retention["t7"] = 5
    asked, looks = [], []
    for _ in range(metadata.CONFIG_TURN_LOOKS):
        looks.append(w.look(cluster))
        asked.append(cluster.settings_asked())
    assert [len(a) for a in asked] == [2] * metadata.CONFIG_TURN_LOOKS
    assert set().union(*asked) == set(cluster.topics)
    assert all(set(look.topics) == set(cluster.topics) for look in looks)
    assert looks[-1].topics["t7"][2] == {"retention.ms": "5"}
    # a new topic, and one recreated (another id), are described at once
    cluster.topics["new"], cluster.retention["new"] = 1, 7
    cluster.ids["t0"] = 2
    w.look(cluster)
    assert {"new", "t0"} <= cluster.settings_asked()
