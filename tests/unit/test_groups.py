"""The pure parts of consumer-group translation (diode.kafka.groups): the search over a
partition's provenance headers against a linear reading of the same partition, and what it
costs (the checkpoint records: tests/unit/test_kafka_messages.py)."""

import bisect
import random
import re
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from diode.kafka import identity
from diode.kafka.messages import ticket_header
from diode.kafka.groups import provenance, read_group_offsets, translate_from

X, OLD, NEW = b"\x0a" * 16, b"\x01" * 16, b"\x0b" * 16  # the wanted incarnation, and two others


class Partition:
    """A destination partition in memory: provenance tuples, None for a record that has none
    (written by someone else, or resent); `reads` counts the fetches."""

    def __init__(self, records, low: int = 0, short: int = 0):
        self.records = list(records)   # (destination offset, provenance tuple or None)
        self.offsets = [o for o, _ in self.records]
        self.low = low
        # Tansu's reported end: the first offset of the last batch + 1, `short` records early
        self.high = (self.offsets[-1] + 1 if self.offsets else 0) - short
        self.reads = 0

    def read(self, start, stop):
        self.reads += 1
        i = bisect.bisect_left(self.offsets, start)
        j = len(self.offsets) if stop is None else bisect.bisect_left(self.offsets, stop)
        return [p for _, p in self.records[i:j] if p is not None]

    def translate(self, offsets, incarnation=X, partition=0):
        return translate_from(self.read, self.low, max(self.low, self.high), incarnation,
                              partition, offsets)


def layout(blocks) -> list:
    """Records from blocks: (incarnation, source partition, source offsets) written in order,
    or None for a record without provenance; destination offsets from 0."""
    out = []
    for block in blocks:
        if block is None:
            out.append((len(out), None))
            continue
        inc, sp, offsets = block
        for s in offsets:
            out.append((len(out), (len(out), inc, sp, s)))
    return out


def reference(records, c, incarnation=X, partition=0):
    """The rule, read linearly: the first record of the incarnation and partition whose source
    offset is c or more, else just after the last below c, else None."""
    ours = [(o, p[3]) for o, p in records
            if p is not None and p[1] == incarnation and p[2] == partition]
    after = [o for o, s in ours if s >= c]
    if after:
        return after[0]
    return ours[-1][0] + 1 if ours else None


def test_a_plain_sequence_with_a_lost_range_older_records_first_and_strays():
    records = layout([(OLD, 0, range(30)), None, (X, 0, range(400)), None,
                      (X, 1, range(5)),  # another source partition spread into this one
                      (X, 0, range(450, 1000)), None])
    records.append((len(records), None))  # a resent record (its provenance is not read)
    part = Partition(records)
    first = 31
    got = part.translate([0, 200, 399, 400, 420, 450, 999, 1000, 5000])
    assert got == {0: first, 200: first + 200, 399: first + 399,
                   # lost on the link: the first after the gap (past a stray and 5 records
                   # of another source partition)
                   400: first + 406, 420: first + 406, 450: first + 406,
                   999: first + 406 + 549,
                   1000: first + 406 + 550, 5000: first + 406 + 550}  # after the last
    assert part.translate([10], incarnation=NEW) == {10: None}
    # the older incarnation: its records are first, the wanted one's after them
    assert part.translate([10, 29, 30, 100], incarnation=OLD) == {10: 10, 29: 29, 30: 30,
                                                                  100: 30}


def test_a_newer_incarnation_after_the_wanted_one_is_not_skipped_into():
    records = layout([(OLD, 0, range(50)), (X, 0, range(0, 300, 3)), (NEW, 0, range(80))])
    part = Partition(records)
    assert part.translate([0, 4, 297, 298, 10_000]) == \
        {0: 50, 4: 52, 297: 149, 298: 150, 10_000: 150}
    assert part.translate([5], incarnation=NEW) == {5: 155}
    # two recreations after it (the end shows NEW alone, so X is taken for older than OLD):
    # not translated rather than translated wrong
    got = part.translate([10, 500], incarnation=OLD)
    assert {c: o for c, o in got.items() if o is not None}.items() <= {10: 10, 500: 50}.items()


def test_the_search_agrees_with_a_linear_reading_of_random_partitions():
    rng = random.Random(26)
    for case in range(300):
        blocks = []
        for inc in rng.sample([OLD, X, NEW], rng.randint(0, 3)):
            offsets = sorted(rng.sample(range(400), rng.randint(0, 120)))
            for s in offsets:  # strays among the records: foreign, another source partition
                r = rng.random()
                blocks.append(None if r < 0.05 else (inc, 1, [s]) if r < 0.1 else
                              (inc, 0, [s]))
        if rng.random() < 0.3:
            blocks = [None] * rng.randint(1, 40) + blocks  # a run of foreign records first
        records = layout(blocks)
        part = Partition(records, short=rng.randint(0, 20) if records else 0)
        cs = [0, 399, 400, *rng.sample(range(420), 8)]
        order = list(dict.fromkeys(p[1] for _, p in records if p is not None))
        for inc in (X, OLD, NEW):
            want = {c: reference(records, c, inc) for c in cs}
            got = part.translate(cs, incarnation=inc)
            if inc in order and len(order) - order.index(inc) > 2:
                # two recreations after it: an answer may be None (the end does not show
                # the first of them), never a wrong offset
                got = {c: want[c] if o is None else o for c, o in got.items()}
            assert got == want, (case, inc)


def test_a_million_records_cost_a_few_small_fetches_per_offset():
    # an older incarnation's records first, a lost range, a foreign record every 1000
    blocks = [(OLD, 0, range(100_000))]
    for start in range(0, 1_000_000, 1000):
        if not 400_000 <= start < 450_000:
            blocks += [(X, 0, range(start, start + 1000)), None]
    part = Partition(layout(blocks))
    got = part.translate([0])
    assert got == {0: 100_000}
    assert part.reads <= 30
    part.reads = 0

    def at(s):  # where source offset s is: the chunks kept before its own, 1001 records each
        k = s // 1000
        return 100_000 + (k if k < 400 else k - 50) * 1001 + s % 1000
    assert part.translate([123_456, 420_000, 999_999, 10**7]) == {
        123_456: at(123_456), 420_000: at(450_000),  # lost: the first after the lost range
        999_999: at(999_999), 10**7: at(999_999) + 1}
    assert part.reads <= 4 * 30


def test_provenance_of_destination_records():
    inc = identity.text(X).encode()
    own = [("app", b"mine"), ("sourceTopic", b"t"), ("sourcePartition", b"3"),
           ("sourceOffset", b"41"), ("sourceTopicId", inc)]
    assert provenance(7, own) == (7, X, 3, 41)
    assert provenance(7, own[:-1]) == (7, b"", 3, 41)  # written before incarnations
    assert provenance(7, [*own, *ticket_header("abc")]) is None  # resent
    assert provenance(7, None) is None
    assert provenance(7, [("app", b"mine")]) is None
    assert provenance(7, [("sourcePartition", b"x"), ("sourceOffset", b"1")]) is None


def test_a_cluster_that_cannot_list_its_groups_yet_is_an_error_its_caller_retries():
    """A broker whose group coordinator is still loading answers ListConsumerGroups with
    COORDINATOR_LOAD_IN_PROGRESS, which the admin client hands back as a KafkaError (not an
    exception): it must come out as the KafkaException the metadata watcher catches and tries
    again after, not end the watcher's thread (seen on a freshly started Apache Kafka)."""
    listed = Future()
    listed.set_result(SimpleNamespace(valid=[], errors=[
        KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)]))
    admin = SimpleNamespace(list_consumer_groups=lambda request_timeout: listed)
    with pytest.raises(KafkaException, match="COORDINATOR_LOAD_IN_PROGRESS|load in progress"):
        read_group_offsets(admin, [re.compile("app")], lambda topic: True)
