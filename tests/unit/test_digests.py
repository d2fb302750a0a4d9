"""Digests of the ranges the sender read (diode.accounting.digests) and their datagram
(wire.KIND_DIGEST)."""

import os

import pytest

from diode.accounting import digests
from diode.errors import RejectedDatagram
from diode.link import wire


def test_a_record_hash_sees_every_part_of_the_record():
    base = digests.record_hash(b"k", b"v", [("h", b"1")], 1000)
    assert base == digests.record_hash(b"k", b"v", (("h", b"1"),), 1000)
    changed = [digests.record_hash(b"K", b"v", [("h", b"1")], 1000),
               digests.record_hash(b"k", b"V", [("h", b"1")], 1000),
               digests.record_hash(b"k", b"v", [("h", b"2")], 1000),
               digests.record_hash(b"k", b"v", [("H", b"1")], 1000),
               digests.record_hash(b"k", b"v", [("h", b"1"), ("h", b"1")], 1000),
               digests.record_hash(b"k", b"v", [("h", b"1")], 1001),
               digests.record_hash(None, b"v", [("h", b"1")], 1000),
               digests.record_hash(b"", b"v", [("h", b"1")], 1000),
               digests.record_hash(b"k", None, [("h", b"1")], 1000),
               digests.record_hash(b"kv", b"", [("h", b"1")], 1000),  # (lengths are hashed)
               digests.record_hash(b"k", b"v", [("h", None)], 1000)]
    assert base not in changed and len(set(changed)) == len(changed)
    assert digests.record_hash(b"k", b"v", None, 5) == digests.record_hash(b"k", b"v", [], 5)
    assert len(base) == 16


def hashes(n, start=0):
    return [digests.record_hash(b"%d" % i, b"v", [], i) for i in range(start, start + n)]


def test_ranges_close_by_count_by_time_and_start_again_after_a_rewind():
    d = digests.Digester(records=10, seconds=5.0)
    assert d.add(("t", 0), b"A" * 16, range(0, 6), hashes(6), now=0.0) == []
    closed = d.add(("t", 0), b"A" * 16, range(6, 18), hashes(12, 6), now=1.0)
    assert closed == [digests.Digest("t", 0, b"A" * 16, 0, 9, 10,
                                     digests.range_digest(hashes(10)))]  # exactly 10
    # the same records in other batches give the same digest: it is over the records
    d2 = digests.Digester(records=10, seconds=5.0)
    d2.add(("t", 0), b"A" * 16, [0], hashes(1), now=0.0)
    assert d2.add(("t", 0), b"A" * 16, range(1, 10), hashes(9, 1), now=0.0) == closed
    d.add(("t", 0), b"A" * 16, [20], hashes(1, 20), now=2.0)  # (compacted: 18, 19 are gone)
    d.add(("t", 1), b"A" * 16, [0], hashes(1), now=6.5)
    assert [(x.partition, x.first, x.last, x.count) for x in d.due(7.0)] == [(0, 10, 20, 9)]
    d.forget()  # a rewind: partition 1's range is read again
    assert d.due(100.0) == []
    # a new incarnation closes the old one's range
    d.add(("t", 0), b"A" * 16, [0, 1], hashes(2), now=0.0)
    closed = d.add(("t", 0), b"B" * 16, [0], hashes(1), now=0.0)
    assert [(x.incarnation, x.count) for x in closed] == [(b"A" * 16, 2)]


def test_digests_cross_the_link_as_a_datagram_kind_of_their_own():
    batch = {"reader": 1, "time_ms": 123, "cluster": "c1", "resend": True,
             "partitions": [("t", 0, b"A" * 16, 0, 11, 12, os.urandom(16)),
                            ("u", 3, b"B" * 16, 5, 9, 3, os.urandom(16))]}
    assert wire.decode_digests(wire.encode_digests(batch)) == batch
    with pytest.raises(RejectedDatagram):
        wire.decode_digests(wire.encode_digests(batch)[:-3])
