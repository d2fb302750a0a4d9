"""diode.link.runs: records of one partition as columns, exactly as they cross the link."""

import os
import struct
from array import array

import pytest
from hypothesis import given, settings, strategies as st

from diode.link import runs
from diode.errors import RejectedDatagram
from diode.link.records import RESEND, Record

optional_bytes = st.one_of(st.none(), st.binary(max_size=200))
headers = st.lists(st.tuples(st.text(max_size=20), optional_bytes), max_size=4).map(tuple)


@st.composite
def chains(draw):
    """Records of one partition as a reader reads them: offsets rising (with holes, as in a
    compacted topic), each naming the one before."""
    topic = draw(st.text(min_size=1, max_size=30))
    partition = draw(st.integers(0, 2**20))
    start = draw(st.one_of(st.integers(0, 2**62), st.just(2**63 - 2**20)))
    steps = draw(st.lists(st.integers(1, 1000), min_size=1, max_size=30))
    prev = draw(st.sampled_from([-1, RESEND, start - 1 if start else -1]))
    out, offset = [], start
    for step in steps:
        out.append(Record(topic, partition, offset,
                          draw(st.integers(-(2**63), 2**63 - 1)), draw(st.integers(0, 2)),
                          draw(optional_bytes), draw(optional_bytes), draw(headers),
                          prev if not out or prev == RESEND else out[-1].offset))
        offset += step
    return out


@settings(max_examples=200, deadline=None)
@given(chains())
def test_round_trip_keeps_every_field(recs):
    encoded = runs.from_records(recs, partition_count=recs[0].partition + 3)
    run = runs.Run.decode(encoded)
    assert run.records() == recs
    assert (run.topic, run.partition, run.partition_count) == \
        (recs[0].topic, recs[0].partition, recs[0].partition + 3)
    # the encoding is the header, the topic and each record's share, nothing else
    assert len(encoded) == runs.HEADER_BYTES + len(recs[0].topic.encode()) + \
        sum(run.record_sizes())
    assert run.encode() == encoded


def test_null_and_empty_stay_distinct():
    recs = [Record("t", 0, 0, 5, 1, None, None, (("n", None), ("e", b""))),
            Record("t", 0, 1, 6, 1, b"", b"", (), 0)]
    back = runs.Run.decode(runs.from_records(recs)).records()
    # a tombstone (value None) must not become an empty value
    assert back[0].value is None and back[1].value == b"" and back[0].key is None
    assert back[0].headers == (("n", None), ("e", b""))


@settings(max_examples=100, deadline=None)
@given(chains(), st.data())
def test_cutting_a_run_keeps_records_and_the_chain(recs, data):
    run = runs.Run.decode(runs.from_records(recs))
    i = data.draw(st.integers(1, max(1, len(recs) - 1)))
    if len(recs) < 2:
        return
    a, b = run.split_at(i)
    assert a.records() + b.records() == recs
    assert runs.Run.decode(b.encode()).records() == recs[i:]


def test_a_payload_of_runs_is_split_by_header_alone():
    r1 = [Record("a", 1, o, 0, 0, None, b"x" * o, (), o - 1) for o in range(5)]
    r2 = [Record("b\u00fc", 7, 9, 0, 0, b"k", None, ())]
    payload = runs.encode_records(r1 + r2, {"a": 2, "b\u00fc": 8})
    found = runs.split_payload(payload)
    assert [(t, p, n) for t, p, n, _ in found] == [(b"a", 1, 5), ("b\u00fc".encode(), 7, 1)]
    assert runs.decode_records(payload) == (r1 + r2, {"a": 2, "b\u00fc": 8})
    for cut in range(len(payload)):
        if cut in (0, len(runs.from_records(r1, 2))):
            continue  # empty, or the first run exactly
        with pytest.raises(RejectedDatagram):
            runs.decode_records(payload[:cut])


def test_decode_rejects_every_truncation_and_extension():
    recs = [Record("t", 1, 5, 1, 0, b"k", b"v", (("h", None),)),
            Record("t", 1, 6, 1, 0, b"k", b"v", (), 5)]
    encoded = runs.from_records(recs)
    for cut in range(len(encoded)):
        with pytest.raises(RejectedDatagram) as exc:
            runs.Run.decode(encoded[:cut])
        assert exc.value.reason == "decode_failed", cut
    with pytest.raises(RejectedDatagram):
        runs.Run.decode(encoded + b"\x00")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decode_of_random_bytes_only_raises_rejected(data):
    for decode in (runs.Run.decode, runs.decode_records):
        try:
            decode(data)
        except RejectedDatagram as exc:
            assert exc.reason == "decode_failed"


@settings(max_examples=300, deadline=None)
@given(chains(), st.data())
def test_a_flipped_bit_is_rejected_or_decodes_to_a_well_formed_run(recs, data):
    """A run comes from an authenticated sender, but a bug there must not crash a writer."""
    encoded = bytearray(runs.from_records(recs))
    pos = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[pos // 8] ^= 1 << (pos % 8)
    try:
        run = runs.Run.decode(bytes(encoded))
    except RejectedDatagram as exc:
        assert exc.reason == "decode_failed"
        return
    back = run.records()  # everything the writer reads from it works
    assert len(back) == len(recs)
    assert all(a.offset < b.offset for a, b in zip(back, back[1:]))


def test_reader_messages_become_the_same_run_as_records():
    class Msg:
        def __init__(self, r):
            self.r = r

        def offset(self):
            return self.r.offset

        def timestamp(self):
            return (self.r.timestamp_type, self.r.timestamp)

        def key(self):
            return self.r.key

        def value(self):
            return self.r.value

        def headers(self):
            return list(self.r.headers) or None

    recs = [Record("t", 2, o, 100 + o, 1, None if o % 2 else b"k", os.urandom(o),
                   (("a", b"1"),) if o == 3 else (), o - 1) for o in range(10, 20)]
    recs[0] = recs[0]._replace(prev_offset=4)
    assert runs.from_messages("t", 2, 3, 4, [Msg(r) for r in recs]) == \
        runs.from_records(recs, partition_count=3)


def test_a_header_name_longer_than_64_kib_crosses():
    """Kafka bounds a header name by nothing smaller than a record: the reader must not fail
    on one (it would stop reading its partitions)."""
    name = "n" * 70_000
    recs = [Record("t", 0, 0, 0, 1, None, b"v", ((name, b"x"), ("short", None)))]
    assert runs.Run.decode(runs.from_records(recs)).records() == recs


@settings(max_examples=100, deadline=None)
@given(chains(), st.data())
def test_joining_the_pieces_of_a_run_gives_it_back(recs, data):
    """Run.join, as the writer joins a partition's runs before producing them."""
    run = runs.Run.decode(runs.from_records(recs, 4))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(recs) - 1)), max_size=5)))
    pieces = [run.take(range(a, b)) for a, b in zip([0, *cuts], [*cuts, len(recs)]) if a < b]
    whole = runs.Run.join(pieces)
    assert whole.records() == recs and whole.prev == run.prev
    assert whole.encode() == run.encode()


# -- nulls, the offset check and header names, column by column --------------------------------

def test_a_run_of_null_keys_and_a_tombstone_is_the_documented_bytes():
    """The wire format of docs/wire-format.md, built here by hand: null keys (Kafka's default)
    and a tombstone are -1 lengths and take no bytes in their blocks."""
    recs = [Record("t", 2, 7, 100, 1, None, b"ab", (), -1),
            Record("t", 2, 8, 101, 1, None, None, (), 7),
            Record("t", 2, 9, 102, 0, b"k", b"", (), 8)]
    body = (b"t" + struct.pack("<3q", 7, 8, 9) + struct.pack("<3q", 100, 101, 102) +
            bytes([1, 1, 0]) + struct.pack("<3i", -1, -1, 1) + struct.pack("<3i", 2, -1, 0) +
            b"k" + b"ab")
    head = runs.HEADER.pack(runs.HEADER_BYTES + len(body), 1, 0, 2, 3, 3, -1, 1, 2, 0,
                            runs.NO_INCARNATION)
    assert runs.from_records(recs, 3) == head + body
    run = runs.Run.decode(head + body)
    assert run.records() == recs
    assert run.key_list() == [None, None, b"k"] and run.value_list() == [b"ab", None, b""]
    assert run.record_sizes() == [runs.FIXED_PER_RECORD + 2, runs.FIXED_PER_RECORD,
                                  runs.FIXED_PER_RECORD + 1]


nulls = st.sampled_from(["none", "all", "some"])


@st.composite
def null_runs(draw):
    """Records whose keys, values and header values are all null, none null, or some: each
    way the columns are read."""
    n = draw(st.integers(1, 40))

    def column(kind):
        if kind == "all":
            return [None] * n
        items = draw(st.lists(st.binary(max_size=30), min_size=n, max_size=n))
        if kind == "some":
            for i in draw(st.sets(st.integers(0, n - 1), min_size=1)):
                items[i] = None
        return items

    keys, values = column(draw(nulls)), column(draw(nulls))
    per_record = draw(st.sampled_from([0, 1, 2, None]))  # headers on each record (None: any)
    hvalues = iter(column(draw(nulls)) * 4)
    out = []
    for i in range(n):
        count = per_record if per_record is not None else draw(st.integers(0, 3))
        hs = tuple((draw(st.sampled_from(["a", "b\u00fc", ""])), next(hvalues, None))
                   for _ in range(count))
        out.append(Record("t", 1, 50 + i, i, 1, keys[i], values[i], hs, 49 + i if i else -1))
    return out


@settings(max_examples=300, deadline=None)
@given(null_runs(), st.data())
def test_nulls_cross_each_way_and_keep_their_sizes(recs, data):
    encoded = runs.from_records(recs)
    run = runs.Run.decode(encoded)
    assert run.records() == recs
    assert run.key_list() == [r.key for r in recs]
    assert run.value_list() == [r.value for r in recs]
    sizes = run.record_sizes()
    assert sizes == [runs.FIXED_PER_RECORD + len(r.key or b"") + len(r.value or b"") +
                     (4 + sum(8 + len(n.encode()) + len(v or b"") for n, v in r.headers)
                      if run.headers is not None else 0) for r in recs]
    assert len(encoded) == runs.HEADER_BYTES + 1 + sum(sizes)
    i = data.draw(st.integers(0, len(recs) - 1))
    j = data.draw(st.integers(i + 1, len(recs)))
    part = run.take(range(i, j))  # (as the packer cuts a run at a datagram's end)
    assert part.records() == recs[i:j]
    assert runs.Run.decode(part.encode()).records() == recs[i:j]


def test_null_keys_from_the_reader_are_the_same_run_as_from_records():
    """confluent_kafka's own Messages, as the kafka_reader gets them."""
    from confluent_kafka import Message
    recs = [Record("t", 0, o, 100 + o, 1, None, None if o == 3 else b"v%d" % o,
                   (("h", b"x"), ("h", None)) if o % 2 else (), o - 1) for o in range(8)]
    msgs = [Message(topic=r.topic, partition=0, offset=r.offset, key=r.key, value=r.value,
                    headers=list(r.headers) or None, timestamp=(1, r.timestamp))
            for r in recs]
    assert runs.from_messages("t", 0, 1, -1, msgs) == runs.from_records(recs)


def _with_offsets(offsets: list, prev: int = -1) -> bytes:
    n = len(offsets)
    return runs.encode("t", 0, 1, prev, array("q", offsets), array("q", [0] * n), bytes(n),
                       array("i", [-1] * n), array("i", [1] * n), b"", b"v" * n)


def test_a_run_whose_offsets_do_not_rise_is_refused():
    """One out of order among consecutive ones (first and last as a consecutive run's), one
    repeated, one going back: each refused, as a run from a broken sender must be."""
    for offsets in ([5, 7, 6, 8], [5, 6, 6, 7], [5, 6, 7, 4], [0, 2, 1, 3, 4, 5, 6, 7] * 2,
                    [2**63 - 3, 2**63 - 1, 2**63 - 2]):
        with pytest.raises(RejectedDatagram) as exc:
            runs.Run.decode(_with_offsets(offsets))
        assert "offsets do not increase" in str(exc.value)
    with pytest.raises(RejectedDatagram):
        runs.Run.decode(_with_offsets([5, 6], prev=5))  # not after the run's predecessor
    for offsets in ([5, 6, 7, 8], [5, 9, 10], [0], [2**63 - 3, 2**63 - 2, 2**63 - 1],
                    list(range(10, 10 + runs.MAX_LANES + 1))):
        assert list(runs.Run.decode(_with_offsets(offsets)).offsets) == offsets


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 40), min_size=1, max_size=20), st.sampled_from([-2, -1, 3]))
def test_a_run_is_accepted_exactly_when_its_offsets_rise_after_prev(offsets, prev):
    rise = offsets[0] > prev and all(a < b for a, b in zip(offsets, offsets[1:]))
    try:
        runs.Run.decode(_with_offsets(offsets, prev))
        accepted = True
    except RejectedDatagram:
        accepted = False
    assert accepted == rise


def test_header_names_are_encoded_once_and_the_cache_stays_bounded():
    many = [[(f"name-{i}", b"v")] for i in range(runs.MAX_NAMES + 50)]
    counts, name_lens, _, names, _ = runs.header_columns(many)
    assert names == b"".join(f"name-{i}".encode() for i in range(runs.MAX_NAMES + 50))
    assert list(counts) == [1] * len(many)
    assert len(runs._encoded) <= runs.MAX_NAMES
    # bytes names, and values given as str (tools), are taken too
    assert runs.header_columns([[(b"n", "\u00fc")], None]) == \
        runs.header_columns([[("n", "\u00fc".encode())], []])


def test_a_run_decodes_the_same_from_bytes_and_from_views_of_any_memory():
    """The writer keeps topic names decoded (runs of one record over many partitions decoded
    each once a run): a run read from bytes, from a view of them, or from a view of writable
    memory (which cannot be a key) gives the same records, one record or many."""
    for n in (1, 3):
        recs = [Record("tø", 2, 10 + i, 1000 + i, 1, b"k", b"v" * i, (("h", b"x"),), 9 + i)
                for i in range(n)]
        raw = runs.from_records(recs, 4)
        for buf in (raw, memoryview(raw), memoryview(bytearray(raw))):
            run = runs.Run.decode(buf)
            assert (run.topic, run.partition_count, run.records()) == ("tø", 4, recs)
