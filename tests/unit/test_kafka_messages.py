"""diode.kafka.messages: what diode writes to Kafka, built and parsed there once. An event is
built with exactly its defined fields; the records and headers are the bytes diode has always
written (spelled out here, so that a change of the wire shows); the provenance parses back from
the headers it built, the nearest diode's counting."""

import json

import pytest

from diode.kafka import identity, messages
from diode.kafka.messages import Provenance
from diode.link.records import Record, provenance_headers

X = b"\x0a" * 16
X_TEXT = identity.text(X).encode()   # b"CgoKCgoKCgoKCgoKCgoKCg"


def test_an_event_is_built_with_exactly_its_fields_in_their_order():
    fields = dict(detectedAt=3, sourceTopic="t", sourcePartition=0, sourceTopicId=None,
                  firstOffset=1, lastOffset=2, reason="gap")
    assert list(messages.MISSING.build(**fields, ticket=None)) == list(messages.MISSING.names)
    with pytest.raises(ValueError, match="fields missing \\['ticket'\\]"):
        messages.MISSING.build(**fields)
    with pytest.raises(ValueError, match="not defined \\['ticket'\\]"):
        messages.FILLED.build(**fields, ticket="x")


def test_the_audits_spark_schema_is_the_definitions():
    assert messages.AUDIT.spark_schema() == (
        "type string, sourceTopic string, sourcePartition int, sourceTopicId string, "
        "firstOffset long, lastOffset long, reason string, detectedAt long, batch long")


def test_provenance_headers_are_the_bytes_diode_writes():
    own = [[("app", b"a0")], [], [("app", None)]]
    headers = messages.provenance_headers("t", 3, X, [40, 41, 45], own, [("writtenAt", b"9")])
    provenance = [("sourceTopic", b"t"), ("sourcePartition", b"3")]
    assert headers == [
        [("app", b"a0"), *provenance, ("sourceOffset", b"40"), ("sourceTopicId", X_TEXT),
         ("writtenAt", b"9")],
        [*provenance, ("sourceOffset", b"41"), ("sourceTopicId", X_TEXT), ("writtenAt", b"9")],
        [("app", None), *provenance, ("sourceOffset", b"45"), ("sourceTopicId", X_TEXT),
         ("writtenAt", b"9")]]
    # without headers of their own, and a record's (the sender's dead letters: no
    # sourceTopicId when its incarnation is unknown)
    assert messages.provenance_headers("t", 3, X, [41]) == [headers[1][:-1]]
    record = Record("t", 3, 41, 1, 1, b"k", b"v", (("app", b"a"),))
    assert provenance_headers(record) == [("app", b"a"), *provenance, ("sourceOffset", b"41")]
    assert provenance_headers(record._replace(incarnation=X))[-1] == ("sourceTopicId", X_TEXT)
    assert messages.written_at_header("writtenAt", 1700) == [("writtenAt", b"1700")]
    assert messages.written_at_header("", 1700) == []
    assert messages.ticket_header("3f0c") == (("diodeTicket", b"3f0c"),)
    assert messages.dead_letter_headers(headers[1], "dst", "too large")[-2:] == [
        ("diode.destination.topic", b"dst"), ("diode.error", b"too large")]


def test_provenance_parses_from_the_headers_it_was_built_in():
    [headers] = messages.provenance_headers("tópico", 3, X, [41], [[("app", b"x")]],
                                            messages.written_at_header("writtenAt", 9))
    assert Provenance.parse(headers) == Provenance("tópico", 3, 41, X, None)
    resent = [*headers, *messages.ticket_header("3f0c")]
    assert Provenance.parse(resent).ticket == "3f0c"
    # written by a diode before topic ids: no incarnation
    [old] = messages.provenance_headers("t", 3, None, [41])
    assert Provenance.parse(old) == Provenance("t", 3, 41, None, None)
    # across two diodes the nearest counts: its offset, and no id when the nearest wrote none
    assert Provenance.parse([*headers, *old]) == Provenance("t", 3, 41, None, None)
    assert Provenance.parse([*old, *headers]).incarnation == X
    # no provenance, or one that does not parse: none
    for bad in (None, [], [("app", b"x")], headers[2:], [("sourceTopic", b"\xff"), *old[1:]],
                [*old[:2], ("sourceOffset", b"x")], [old[0], ("sourcePartition", None), old[2]]):
        assert Provenance.parse(bad) is None, bad
    assert Provenance.parse([*old, ("sourceTopicId", b"not an id")]).incarnation is None


def test_the_receivers_records_are_the_bytes_diode_writes():
    assert messages.range_record("missing", "t", 0, X, 120, 139, "gap", 1795300000000,
                                 ticket="3f0c") == (
        b"t-0", b'{"type": "missing", "sourceTopic": "t", "sourcePartition": 0, '
        b'"sourceTopicId": "CgoKCgoKCgoKCgoKCgoKCg", "firstOffset": 120, "lastOffset": 139, '
        b'"reason": "gap", "detectedAt": 1795300000000, "ticket": "3f0c"}')
    _, filled = messages.range_record("filled", "t", 0, None, 1, 2, "late", 5)
    assert json.loads(filled)["sourceTopicId"] is None
    _, closed = messages.range_record("closed", "t", 0, X, 1, 2, "filled", 5, ticket="3f0c",
                                      state="filled", opened_at=3, closed_at=5)
    assert list(json.loads(closed)) == list(messages.CLOSED.names)
    with pytest.raises(ValueError, match="fields missing \\['ticket'\\]"):
        messages.range_record("missing", "t", 0, X, 1, 2, "gap", 5)
    with pytest.raises(ValueError, match="not defined \\['ticket'\\]"):
        messages.range_record("filled", "t", 0, X, 1, 2, "late", 5, ticket=None)
    assert messages.digest_record("t", 1, X, 0, 9, 10, b"\x01\xff", 77, "c1", False) == (
        b"t-1", b'{"sourceTopic": "t", "sourcePartition": 1, "sourceTopicId": '
        b'"CgoKCgoKCgoKCgoKCgoKCg", "firstOffset": 0, "lastOffset": 9, "count": 10, '
        b'"digest": "01ff", "sentAt": 77, "sourceCluster": "c1", "resend": false}')
    assert messages.heartbeat_record("s1", 70, 71, 0, None, {"read": 3},
                                     [("t", 1, X, 0, 9, 12, False)]) == (
        b"s1", b'{"senderTime": 70, "receivedAt": 71, "reader": 0, "session": "s1", '
        b'"sourceCluster": null, "partitions": 1, "counters": {"read": 3}, "lastSent": '
        b'[{"topic": "t", "partition": 1, "offset": 9, "chainStart": 0, '
        b'"topicId": "CgoKCgoKCgoKCgoKCgoKCg", "sourceEnd": 12, "retired": false}]}')
    event = messages.audit_event("missing", "t", 2, None, 5, 6, 99, 12)
    assert list(event) == list(messages.AUDIT.names)
    assert messages.audit_record(event)[0] == b"t-2"


def test_a_range_event_parses_from_what_the_receiver_wrote():
    """The readers of the missing-records topic (the restart's recovery, `diode tickets`, the
    digest audit) take its events through RangeEvent.parse: typed, and None for what is not
    one."""
    _, value = messages.range_record("closed", "t", 0, X, 1, 2, "filled", 5, ticket="3f0c",
                                     state="filled", opened_at=3, closed_at=7)
    assert messages.RangeEvent.parse(value) == messages.RangeEvent(
        "closed", "t", 0, X_TEXT.decode(), 1, 2, "filled", 5, "3f0c", "filled", 7)
    _, value = messages.range_record("missing", "t", 0, None, 1, 2, "gap", 5, ticket=None)
    e = messages.RangeEvent.parse(json.loads(value))
    assert (e.ticket, e.topic_id, e.incarnation) == (None, None, None)
    assert messages.RangeEvent.parse(value.replace(b'"reason": "gap", ', b"")).reason == ""
    for bad in (b"not json", b"[1]", b'{"type": "heartbeat"}', value.replace(b"0, ", b'"x", '),
                value.replace(b'"firstOffset": 1, ', b""), None):
        assert messages.RangeEvent.parse(bad) is None, bad


def test_the_heartbeats_spark_schema_reads_what_the_receiver_writes():
    """The audit reads heartbeats with the schema generated from their definition: every
    field of lastSent, of the type written (diode.spark.verify.claims)."""
    assert messages.HEARTBEAT.spark_schema("receivedAt", "lastSent") == (
        "receivedAt long, lastSent array<struct<topic: string, partition: int, offset: long, "
        "chainStart: long, topicId: string, sourceEnd: long, retired: boolean>>")
    _, value = messages.heartbeat_record("s1", 70, 71, 0, None, {}, [("t", 1, X, 0, 9, 12, True)])
    assert list(json.loads(value)["lastSent"][0]) == [f.name for f in messages.LAST_SENT]


def test_a_checkpoint_names_the_group_both_sides_and_the_incarnation():
    key, value = messages.group_checkpoint_record("g", "t", 2, 600, "dst_t", 2, 640, X, 1234)
    assert key == b'{"consumerGroupId":"g","topic":"dst_t","partition":2}'
    assert value == (b'{"consumerGroupId":"g","topic":"dst_t","partition":2,'
                     b'"upstreamOffset":600,"downstreamOffset":640,"sourceTopic":"t",'
                     b'"sourcePartition":2,"sourceTopicId":"CgoKCgoKCgoKCgoKCgoKCg","time":1234}')
    # a later checkpoint of the same group and partition has the same key (compaction keeps it)
    assert messages.group_checkpoint_record("g", "t", 2, 900, "dst_t", 2, 950, X, 5)[0] == key
    assert messages.group_checkpoint_record("g", "t", 3, 900, "dst_t", 3, 950, X, 5)[0] != key


def test_the_missing_records_fields_in_the_settings_reference_are_the_definitions():
    line = messages.missing_records_fields()
    assert f"type missing: {', '.join(messages.MISSING.names)};" in line
    assert line.endswith("closed: with state, openedAt, closedAt")


def test_a_partitions_provenance_made_once_is_the_bytes_made_each_time(monkeypatch):
    """The writer keeps each source partition's own provenance headers made (runs of one record
    over a thousand partitions made them once a record): its records' headers are the same
    bytes the first time, when kept, and past the bound (made again at each call)."""
    Y = b"\x0b" * 16
    first = messages.provenance_headers("t", 7, Y, [5, 6], None, [("writtenAt", b"9")])
    expected = [[("sourceTopic", b"t"), ("sourcePartition", b"7"), ("sourceOffset", b"%d" % o),
                 ("sourceTopicId", identity.text(Y).encode()), ("writtenAt", b"9")]
                for o in (5, 6)]
    assert first == expected
    assert messages.provenance_headers("t", 7, Y, [5, 6], None, [("writtenAt", b"9")]) == expected
    # another partition, another incarnation, none: each its own
    assert messages.provenance_headers("t", 8, Y, [5])[0][1] == ("sourcePartition", b"8")
    assert messages.provenance_headers("t", 7, X, [5])[0][3] == ("sourceTopicId", X_TEXT)
    assert messages.provenance_headers("t", 7, None, [5]) == [[h for h in expected[0][:3]]]
    monkeypatch.setattr(messages, "_provenances", {})
    monkeypatch.setattr(messages, "MAX_PROVENANCES", 0)  # (none kept: made at each call)
    assert messages.provenance_headers("t", 7, Y, [5, 6], None, [("writtenAt", b"9")]) == expected
    assert messages._provenances == {}
