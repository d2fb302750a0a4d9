"""Consumer positions across the diode (diode.kafka.groups) against real brokers, both kinds: the
committed offsets of the groups sender.groups names, their translation from the provenance
headers of a destination partition as the kafka_writer leaves it (an older incarnation first, a
range lost on the link, strays), and the commit for the same group on the destination, after
which a consumer of that group reads exactly what it had not processed on the source."""

import re
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from diode.kafka import identity
from diode.kafka.groups import ACTIVE, NOT_AHEAD, apply, read_group_offsets, translate
from diode.kafka.messages import TICKET_HEADER, ticket_header
from diode.link.records import Record, provenance_headers
from tests.conftest import RECENT_MS, client, committed_offsets, create_topic, produce, wait_for

X, OLD, OTHER = b"\x0a" * 16, b"\x01" * 16, b"\x0c" * 16  # incarnations of source topic "t"
LOST = range(400, 450)  # source offsets lost on the link
ARRIVED = [s for s in range(1000) if s not in LOST]
# A group member's settings: Tansu takes a join about as long as the rebalance timeout
# (max.poll.interval.ms, 300 s by default) allows, ~23 s; 3 s with these
MEMBER = {"session.timeout.ms": 6000, "max.poll.interval.ms": 7000}


def written(offset: int, incarnation: bytes = X, partition: int = 0, resent: bool = False):
    """A destination record as the kafka_writer writes source record t[partition]@offset."""
    record = Record("t", partition, offset, RECENT_MS + offset, 1, b"k%d" % offset,
                    b"v%d" % offset, (("app", b"own"),), incarnation=incarnation)
    headers = provenance_headers(record) + (list(ticket_header("f00d")) if resent else [])
    return {"key": record.key, "value": record.value, "headers": headers,
            "timestamp": record.timestamp, "partition": 0}


def lay_out(bootstrap: str) -> dict:
    """dst_t partition 0 as a receiver leaves it: the records of the topic's older incarnation,
    one without provenance, then t[0]@0..999 of incarnation X but 400..449 (lost), with another
    stranger in the middle and a record of 420 resent at the end. Returns source offset ->
    destination offset of X's records (dst_t partition 1 holds other records)."""
    create_topic(bootstrap, "dst_t", 2)
    records = [written(s, OLD) for s in range(30)] + [{"value": b"no provenance",
                                                       "partition": 0}]
    at = {}
    for s in ARRIVED:
        if s == 700:
            records.append({"value": b"someone else's", "partition": 0})
        at[s] = len(records)
        records.append(written(s))
    records.append(written(420, resent=True))
    # idempotent, as the writer's producer: a retried batch never lands after the next one
    in_order = {"bootstrap.servers": bootstrap, "enable.idempotence": True}
    produce(in_order, "dst_t", records)
    produce(in_order, "dst_t", [{**written(s, X, 1), "partition": 1} for s in range(10)])
    return at


def test_translate_finds_the_first_record_at_or_after_each_committed_offset(start_brokers,
                                                                              broker_kind):
    destination, = start_brokers(broker_kind, "destination")
    settings = destination.client_config()
    at = lay_out(destination.bootstrap)
    got = translate(settings, "dst_t", 0, X, [0, 600, 399, 420, 450, 999, 1000, 5000])
    assert got == {0: at[0], 600: at[600], 399: at[399],
                   420: at[450], 450: at[450],  # lost on the link: the first after the range
                   999: at[999], 1000: at[999] + 1, 5000: at[999] + 1}  # after the last
    # the older incarnation: its own records, else where the newer one starts
    assert translate(settings, "dst_t", 0, OLD, [5, 29, 30]) == {5: 5, 29: 29, 30: 30}
    # the other partition holds source partition 1's records
    assert translate(settings, "dst_t", 1, X, [3, 20]) == {3: 3, 20: 10}
    assert got.why is None
    # nothing of that incarnation, no such partition (the writer spreads source partition 7
    # by key), no such topic: not translatable, and why
    for topic, partition, incarnation, why in [
            ("dst_t", 0, OTHER, "no record of source partition 0 of incarnation DAwM"),
            ("dst_t", 7, X, "has 2 partition(s): source partition 7 is spread"),
            ("dst_nothing", 0, X, "dst_nothing does not exist")]:
        got = translate(settings, topic, partition, incarnation, [5])
        assert got == {5: None} and why in got.why


def read_as_group(bootstrap: str, group: str, expected: int, timeout: float = 60) -> list:
    """The records a consumer of `group` subscribed to dst_t reads from the group's committed
    position (a partition without one: from the end, so nothing), until `expected` have come
    and a moment after, as (sourceOffset, resent) of X's records on partition 0."""
    c = Consumer(client(bootstrap, **MEMBER, **{"group.id": group, "enable.auto.commit": False,
                                                "auto.offset.reset": "latest"}))
    c.subscribe(["dst_t"])
    out, deadline, done_at = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.3):
                h = dict(m.headers() or [])
                if m.error() is None and m.partition() == 0 and \
                        h.get("sourceTopicId") == identity.text(X).encode():
                    out.append((int(h["sourceOffset"]), TICKET_HEADER in h))
            if len(out) >= expected:
                done_at = done_at or time.monotonic() + 1.0
                if time.monotonic() >= done_at:
                    break
    finally:
        c.close()
    return out


def test_a_group_committed_on_the_destination_resumes_where_it_stopped_on_the_source(
        start_brokers, broker_kind):
    destination, = start_brokers(broker_kind, "destination")
    settings = destination.client_config()
    admin = AdminClient(settings)
    at = lay_out(destination.bootstrap)

    # The group had processed t[0] up to 599 on the source: it reads 600.. on the destination,
    # nothing before (the resent 420 at the end is read too: written after them)
    half = translate(settings, "dst_t", 0, X, [600])[600]
    applied = apply(admin, "app-half", {("dst_t", 0): half})
    assert applied.committed == {("dst_t", 0): at[600]} and not applied.left
    assert not applied.active
    got = read_as_group(destination.bootstrap, "app-half", 400 + 1)
    assert [s for s, resent in got if not resent] == list(range(600, 1000))

    # Committed at 420 on the source, inside the range lost on the link: it starts at 450
    gap = translate(settings, "dst_t", 0, X, [420])[420]
    assert apply(admin, "app-gap", {("dst_t", 0): gap}).committed == {("dst_t", 0): at[450]}
    got = read_as_group(destination.bootstrap, "app-gap", 550 + 1)
    assert [s for s, resent in got if not resent] == list(range(450, 1000))

    # An older source commit never moves the group back on the destination
    back = translate(settings, "dst_t", 0, X, [200])[200]
    applied = apply(admin, "app-half", {("dst_t", 0): back, ("dst_t", 1): 5})
    assert applied.committed == {("dst_t", 1): 5}
    assert applied.left == {("dst_t", 0): (at[200], NOT_AHEAD, at[600])}
    assert committed_offsets(destination.bootstrap, "app-half", "dst_t", 2) == [at[600], 5]

    # A group with a member on the destination: nothing committed, the caller is told
    member = Consumer(client(destination.bootstrap, **MEMBER,
                             **{"group.id": "app-live", "enable.auto.commit": False}))
    member.subscribe(["dst_t"])
    try:
        wait_for(lambda: (member.poll(0.2), member.assignment())[1], 60,
                 "the member's assignment")
        applied = apply(admin, "app-live", {("dst_t", 0): half})
        assert applied.active and applied.committed == {}
        assert applied.left == {("dst_t", 0): (half, ACTIVE, None)}
    finally:
        member.close()
    assert committed_offsets(destination.bootstrap, "app-live", "dst_t", 1) == [-1001]


def test_the_offsets_of_the_groups_that_match_for_the_topics_replicated(start_brokers,
                                                                         broker_kind):
    source, = start_brokers(broker_kind, "source")
    for topic in ("t", "u", "skipped"):
        create_topic(source.bootstrap, topic, 2)

    def commit(group: str, offsets: dict) -> None:
        c = Consumer(client(source.bootstrap, **{"group.id": group}))
        try:
            c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                     asynchronous=False)
        finally:
            c.close()

    commit("orders-app", {("t", 0): 600, ("t", 1): 3, ("u", 1): 0, ("skipped", 0): 9})
    commit("billing", {("t", 0): 100})
    admin = AdminClient(source.client_config())
    wanted = {"t", "u"}.__contains__
    got = wait_for(lambda: read_group_offsets(admin, [re.compile(r"orders-.*")], wanted), 30,
                   "the group's offsets")
    assert got == {"orders-app": {("t", 0): 600, ("t", 1): 3, ("u", 1): 0}}
    got = read_group_offsets(admin, [re.compile("billing"), re.compile("orders-app")],
                             {"t"}.__contains__)
    assert got == {"orders-app": {("t", 0): 600, ("t", 1): 3}, "billing": {("t", 0): 100}}
    assert read_group_offsets(admin, [re.compile("orders")], wanted) == {}  # fullmatch
