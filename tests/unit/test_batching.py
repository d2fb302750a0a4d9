"""diode.link.batching: the packer's datagram filling, checked by decoding what it produced."""

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from diode.link import codec, crypto, runs, wire
from diode.link.batching import DatagramBuilder
from diode.link.records import Record

MASTER = os.urandom(32)
PARTITIONS = 3


class Link:
    """A real packer's sealing (wire.Sealer + SessionCipher) and a receiver's keyring."""

    def __init__(self, limit, compression="none", cipher="aes-256-gcm"):
        cid = crypto.CIPHER_IDS[cipher]
        self.cipher, self.compression = cipher, compression
        self.sealer = wire.Sealer(
            crypto.SessionCipher(cid, MASTER if cid else None, crypto.new_session_id()),
            compression)
        self.keyring = crypto.Keyring(cid, MASTER if cid else None)
        self.limit = limit
        self.builder = DatagramBuilder(limit, self.sealer.seal, compression != "none")
        self.sealed, self.oversize = [], []

    def add(self, records, tag=None):
        """Records as the reader sends them: a run per stretch of one partition and one
        reader message (tag_of, unless `tag`)."""
        records = chained(records)
        i = 0
        while i < len(records):
            key = lambda r: (r.topic, r.partition, tag or tag_of(r))
            j = i + 1
            while j < len(records) and key(records[j]) == key(records[i]):
                j += 1
            s, o = self.builder.add(runs.from_records(records[i:j], PARTITIONS),
                                    tag or tag_of(records[i]), j - i)
            self.sealed += s
            self.oversize += [(runs.Run.decode(run).records()[0], t) for run, t in o]
            i = j

    def flush(self):
        s, o = self.builder.flush()
        self.sealed += s
        self.oversize += [(runs.Run.decode(run).records()[0], t) for run, t in o]

    def opened(self):
        """The records of every datagram, per datagram, as the receiver decodes them."""
        out = []
        for s in self.sealed:
            records, counts = wire.open_datagram(s.datagram, self.keyring)
            assert counts == {r.topic: PARTITIONS for r in records}
            out.append(records)
        return out

    def fits_alone(self, record):
        probe = wire.Sealer(crypto.SessionCipher(self.sealer.cipher.cipher_id, MASTER, 1),
                            self.compression)
        return len(probe.seal(runs.from_records([record], PARTITIONS))) <= self.limit


def tag_of(record):
    return ("reader-0", record.offset // 3)  # a few records share each reader message


def chained(records):
    """Records with prev_offset set as the sender's chain of each partition sets it."""
    last, out = {}, []
    for r in records:
        tp = (r.topic, r.partition)
        out.append(r._replace(prev_offset=last.get(tp, -1)))
        last[tp] = r.offset
    return out


def check(link, records):
    """What every run of the builder must guarantee."""
    records = chained(records)
    link.flush()
    assert link.builder.pending == 0
    opened = link.opened()

    # never larger than the link allows
    assert all(len(s.datagram) <= link.limit for s in link.sealed)
    # every record exactly once, in order within the datagrams and within the oversize list
    sent = [r for batch in opened for r in batch]
    over = [r for r, _ in link.oversize]
    assert sorted(r.offset for r in sent + over) == [r.offset for r in records]
    assert sent == sorted(sent, key=lambda r: r.offset)
    assert over == sorted(over, key=lambda r: r.offset)
    assert sent == [r for r in records if r not in over]  # content intact
    # tag counts say exactly which records each datagram carries
    for s, batch in zip(link.sealed, opened):
        assert s.tags == Counter(tag_of(r) for r in batch)
        assert sum(s.tags.values()) == len(batch) > 0
    # oversize carries the original tag, and only records that could never fit
    for r, tag in link.oversize:
        assert tag == tag_of(r)
        assert not link.fits_alone(r)
    return opened


payloads = st.one_of(
    st.none(),
    st.binary(max_size=1500),
    st.integers(0, 6000).map(lambda n: b"abc" * (n // 3)),      # compressible
    st.integers(0, 3000).map(os.urandom),                        # incompressible
)
record_specs = st.lists(
    st.tuples(st.sampled_from(["a", "orders", "\u00fcber-topic", "t" * 40]),
              st.integers(0, 5), payloads, st.one_of(st.none(), st.binary(max_size=40)),
              st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(),
                                                                st.binary(max_size=30))),
                       max_size=3)),
    max_size=40)


def make_records(specs):
    return [Record(topic, partition, offset, 1_700_000_000_000 + offset, 1, key, value,
                   tuple(headers))
            for offset, (topic, partition, value, key, headers) in enumerate(specs)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(specs=record_specs,
       limit=st.sampled_from([256, 600, 1472, 8972]),
       compression=st.sampled_from(["none", "gzip", "zstd", "lz4"]),
       cipher=st.sampled_from(["aes-256-gcm", "chacha20-poly1305", "none"]))
def test_builder_guarantees(specs, limit, compression, cipher):
    records = make_records(specs)
    link = Link(limit, compression, cipher)
    link.add(records)
    check(link, records)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd", "lz4"])
def test_small_records_share_datagrams_and_fill_them(compression):
    # as a reader sends them: one run per partition of each consume batch
    records = [Record("orders", i // 700, i, 0, 0, f"key-{i}".encode(),
                      os.urandom(60), ()) for i in range(2000)]
    link = Link(1472, compression)
    link.add(records, tag="m1")
    opened = check_untagged(link, records)

    assert not link.oversize
    assert len(opened) < 2000 / 10  # many records per datagram
    # all but the last datagram of each partition's run are nearly full
    full = 0.9 if compression == "none" else 0.5  # (aiming at a learnt compression ratio)
    assert sum(len(s.datagram) > full * 1472 for s in link.sealed) >= len(link.sealed) - 3


def test_a_run_larger_than_a_datagram_is_cut_by_record_and_tagged_per_piece():
    records = [Record("orders", 1, i, 0, 0, None, os.urandom(100), ()) for i in range(300)]
    link = Link(1472)
    link.add(records, tag="m1")  # one reader message, one run of 300 records
    opened = check_untagged(link, records)
    assert len(opened) > 20 and all(len(s.datagram) > 0.8 * 1472 for s in link.sealed[:-1])
    assert sum(s.tags["m1"] for s in link.sealed) == 300


def check_untagged(link, records):
    link.flush()
    opened = link.opened()
    assert [r for batch in opened for r in batch] == chained(records)
    assert all(len(s.datagram) <= link.limit for s in link.sealed)
    return opened


def test_compressible_records_pack_beyond_the_uncompressed_budget():
    records = [Record("logs", 0, i, 0, 0, None, b"INFO request served in 3 ms\n" * 10, ())
               for i in range(500)]
    link = Link(1472, "zstd")
    link.add(records)
    opened = check(link, records)
    uncompressed = sum(len(runs.encode_records(batch)) for batch in opened)
    assert uncompressed / len(opened) > 1472  # compression buys more records per datagram


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd", "lz4"])
def test_a_record_too_large_for_any_datagram_comes_back_as_oversize(compression):
    small = [Record("t", 0, i, 0, 0, None, b"s" * 10, ()) for i in range(3)]
    big = Record("t", 0, 3, 0, 0, None, os.urandom(5000), ())
    after = Record("t", 0, 4, 0, 0, None, b"s" * 10, ())
    records = [*small, big, after]
    link = Link(1472, compression)
    link.add(records)
    opened = check(link, records)

    assert link.oversize == [(chained(records)[3], tag_of(big))]
    assert [r for batch in opened for r in batch] == [r for r in chained(records) if r.offset != 3]


def test_a_large_compressible_record_is_not_oversize_when_compressed():
    big = Record("t", 0, 0, 0, 0, None, b"z" * 20000, ())
    link = Link(1472, "zstd")
    link.add([big])
    opened = check(link, [big])
    assert link.oversize == [] and opened == [chained([big])]


def test_nothing_is_emitted_until_full_or_flushed():
    link = Link(8972)
    records = [Record("t", 0, i, 0, 0, None, b"v" * 20, ()) for i in range(5)]
    link.add(records)
    assert link.sealed == [] and link.builder.pending == 5

    link.flush()
    assert [r for batch in link.opened() for r in batch] == chained(records)
    assert link.builder.pending == 0
    assert link.builder.flush() == ([], [])  # flushing nothing emits nothing


def test_tags_count_records_per_reader_message():
    link = Link(8972)
    tags = ["m1", "m1", "m2", "m1", "m3", "m3"]
    for i, tag in enumerate(tags):
        link.add([Record("t", 0, i, 0, 0, None, b"v", ())], tag)
    link.flush()
    assert len(link.sealed) == 1
    assert link.sealed[0].tags == {"m1": 3, "m2": 1, "m3": 2}


def test_a_record_the_receiver_cannot_decompress_is_not_sent():
    huge = Record("t", 0, 0, 0, 0, None, bytes(codec.MAX_BATCH_BYTES + 1000), ())
    link = Link(65507, "zstd")
    link.add([huge])
    link.flush()
    if link.oversize:
        assert link.oversize == [(chained([huge])[0], tag_of(huge))]
    else:
        assert link.opened() == [chained([huge])]


@pytest.mark.parametrize("compression", ["gzip", "zstd", "lz4"])
def test_data_turning_incompressible_still_fits(compression):
    """The builder learns a high compression ratio, then the data stops compressing: the
    batches it aimed at come out too large and must be split, never sent oversized."""
    records = [Record("t", 0, i, 0, 0, None, b"a" * 300, ()) for i in range(200)]
    records += [Record("t", 0, i, 0, 0, None, os.urandom(300), ()) for i in range(200, 400)]
    link = Link(1472, compression)
    link.add(records)
    check(link, records)
    assert not link.oversize
