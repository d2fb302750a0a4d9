"""diode.codec: record batches as Avro bytes, and the compression around them."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from diode import codec
from diode.errors import RejectedDatagram
from diode.records import Record

optional_bytes = st.one_of(st.none(), st.binary(max_size=200))
records = st.builds(
    Record,
    topic=st.text(min_size=1, max_size=30),
    # the extremes need the longest varints: the size bound must cover them
    partition=st.one_of(st.integers(0, 2**31 - 1), st.just(2**31 - 1)),
    offset=st.one_of(st.integers(0, 2**63 - 1), st.just(2**63 - 1)),
    timestamp=st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), -1])),
    timestamp_type=st.integers(0, 2),
    key=optional_bytes,
    value=optional_bytes,
    headers=st.lists(st.tuples(st.text(max_size=20), optional_bytes), max_size=4).map(tuple),
    prev_offset=st.one_of(st.integers(-1, 2**63 - 1), st.just(-1)),
)


def counts_for(batch):
    return {r.topic: 1 + (r.partition % 7) for r in batch}


def encoded_alone(record):
    """The exact bytes one record takes inside a batch."""
    return len(codec.encode_batch([record], {})) - len(codec.encode_batch([], {})) - 1


def encoded_topic_entry(topic, partitions):
    """The exact bytes one partition_counts entry takes inside a batch."""
    return len(codec.encode_batch([], {topic: partitions})) - len(codec.encode_batch([], {})) - 1


# -- Avro batches ------------------------------------------------------------------------------

def test_round_trip_keeps_every_field():
    batch = [
        Record("orders", 3, 1234567890123, 1_700_000_000_000, 1, b"key", b"value",
               (("trace", b"\x00\xff"), ("empty", b""), ("nothing", None))),
        Record("caf\u00e9-\u65e5\u672c", 0, 0, -1, 0, None, None, ()),
        Record("orders", 3, 1234567890124, 0, 2, b"", b"", (("dup", b"1"), ("dup", b"2"))),
    ]
    counts = {"orders": 12, "caf\u00e9-\u65e5\u672c": 1}

    decoded, decoded_counts = codec.decode_batch(codec.encode_batch(batch, counts))

    assert decoded == batch
    assert decoded_counts == counts
    # None and b"" stay distinct: a tombstone (value None) must not become an empty value.
    assert decoded[1].value is None and decoded[2].value == b""
    assert decoded[0].headers[2] == ("nothing", None)


@settings(max_examples=200, deadline=None)
@given(st.lists(records, max_size=8))
def test_round_trip_random_batches(batch):
    counts = counts_for(batch)
    assert codec.decode_batch(codec.encode_batch(batch, counts)) == (batch, counts)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=8),
       st.integers(1, 2**31 - 1))
def test_size_bound_covers_the_real_encoding(batch, partitions):
    """The builder trusts these bounds to never make a datagram larger than the link allows."""
    counts = {r.topic: partitions for r in batch}
    bound = codec.BATCH_OVERHEAD + sum(codec.encoded_size_bound(r) for r in batch)
    bound += sum(codec.TOPIC_ENTRY_OVERHEAD + len(t.encode()) for t in counts)

    assert len(codec.encode_batch(batch, counts)) <= bound


@settings(max_examples=300, deadline=None)
@given(records)
def test_size_bound_of_one_record(record):
    assert encoded_alone(record) <= codec.encoded_size_bound(record)


@pytest.mark.parametrize("topic", ["t", "t" * 300])
@pytest.mark.parametrize("key, value", [(None, None), (b"k" * 200, None), (b"", b"v" * 20000)])
@pytest.mark.parametrize("headers", [(), (("h", None),),
                                     tuple((f"h{i}" * 50, b"v" * 150) for i in range(70))])
def test_size_bound_with_extreme_varints(topic, key, value, headers):
    r = Record(topic, 2**31 - 1, 2**63 - 1, -(2**63), -(2**31), key, value, headers)
    assert encoded_alone(r) <= codec.encoded_size_bound(r)


@settings(max_examples=100, deadline=None)
@given(st.lists(records, min_size=1, max_size=150), st.integers(1, 2**31 - 1))
def test_each_part_of_the_size_bound_holds(batch, partitions):
    """Each constant the builder adds up is an upper bound of its own part of the encoding."""
    counts = {r.topic: partitions for r in batch}
    for r in batch:
        assert encoded_alone(r) <= codec.encoded_size_bound(r)
    for topic in counts:
        assert encoded_topic_entry(topic, partitions) <= \
            codec.TOPIC_ENTRY_OVERHEAD + len(topic.encode())
    framing = len(codec.encode_batch(batch, counts)) - sum(encoded_alone(r) for r in batch) \
        - sum(encoded_topic_entry(t, partitions) for t in counts)
    assert 0 < framing <= codec.BATCH_OVERHEAD


@pytest.mark.parametrize("garbage", [
    b"\xff" * 16,           # varints that never end
    b"\x01",                # a map block that claims an entry, then nothing
    b"\x00\x02\x02",        # one record, truncated inside it
    os.urandom(8) + b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
])
def test_decode_rejects_garbage(garbage):
    with pytest.raises(RejectedDatagram) as exc:
        codec.decode_batch(garbage)
    assert exc.value.reason == "decode_failed"


def test_decode_rejects_every_truncation():
    r = Record("t", 1, 5, 1, 0, b"k", b"v", (("h", None),))
    encoded = codec.encode_batch([r, r._replace(offset=6)], {"t": 3})
    for cut in range(len(encoded)):
        with pytest.raises(RejectedDatagram) as exc:
            codec.decode_batch(encoded[:cut])
        assert exc.value.reason == "decode_failed", cut


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_of_random_bytes_only_raises_rejected(data):
    try:
        records_, counts = codec.decode_batch(data)
    except RejectedDatagram as exc:
        assert exc.reason == "decode_failed"
    else:
        assert isinstance(records_, list) and isinstance(counts, dict)


# -- compression -------------------------------------------------------------------------------

KINDS = ["none", "gzip", "zstd", "lz4"]
COMPRESSED = ["gzip", "zstd", "lz4"]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=5000))
def test_compress_round_trip(kind, data):
    packed = codec.compress(kind, data)
    assert codec.decompress(codec.COMPRESSION_IDS[kind], packed) == data


@pytest.mark.parametrize("kind", COMPRESSED)
def test_compression_shrinks_repetitive_batches(kind):
    r = Record("metrics", 0, 0, 0, 0, None, b"temperature=21.5;" * 40, ())
    payload = codec.encode_batch([r._replace(offset=i) for i in range(50)], {"metrics": 1})
    packed = codec.compress(kind, payload)
    assert len(packed) < len(payload) / 4
    assert codec.decompress(codec.COMPRESSION_IDS[kind], packed) == payload


@pytest.mark.parametrize("kind", KINDS)
def test_decompress_accepts_exactly_the_limit(kind):
    data = b"a" * 4096
    assert codec.decompress(codec.COMPRESSION_IDS[kind], codec.compress(kind, data),
                            limit=4096) == data


@pytest.mark.parametrize("kind", KINDS)
def test_decompress_rejects_output_over_the_limit(kind):
    packed = codec.compress(kind, b"a" * 4097)
    with pytest.raises(RejectedDatagram) as exc:
        codec.decompress(codec.COMPRESSION_IDS[kind], packed, limit=4096)
    assert exc.value.reason == "decompress_failed"


@pytest.mark.parametrize("kind", COMPRESSED)
def test_decompression_bomb_is_rejected_at_the_default_limit(kind):
    """A few KB on the wire must not make a receiver allocate more than MAX_BATCH_BYTES."""
    bomb = codec.compress(kind, bytes(codec.MAX_BATCH_BYTES + 1))
    assert len(bomb) < 64 * 1024  # it fits in one datagram
    with pytest.raises(RejectedDatagram) as exc:
        codec.decompress(codec.COMPRESSION_IDS[kind], bomb)
    assert exc.value.reason == "decompress_failed"


@pytest.mark.parametrize("kind", COMPRESSED)
@pytest.mark.parametrize("garbage", [b"\x00" * 32, b"not compressed at all, just text",
                                     bytes(range(256))])
def test_decompress_rejects_garbage(kind, garbage):
    with pytest.raises(RejectedDatagram) as exc:
        codec.decompress(codec.COMPRESSION_IDS[kind], garbage)
    assert exc.value.reason == "decompress_failed"


@pytest.mark.parametrize("kind", ["gzip", "lz4"])
def test_decompress_rejects_truncated_streams(kind):
    packed = codec.compress(kind, os.urandom(2000))
    for cut in (0, 1, len(packed) // 2, len(packed) - 1):
        with pytest.raises(RejectedDatagram) as exc:
            codec.decompress(codec.COMPRESSION_IDS[kind], packed[:cut])
        assert exc.value.reason == "decompress_failed", cut


def test_decompress_rejects_truncated_zstd_frames():
    packed = codec.compress("zstd", os.urandom(2000))
    for cut in (0, 4, len(packed) // 2, len(packed) - 1):
        with pytest.raises(RejectedDatagram) as exc:
            codec.decompress(codec.COMPRESSION_IDS["zstd"], packed[:cut])
        assert exc.value.reason == "decompress_failed", cut


@pytest.mark.parametrize("kind_id", [4, 7, 255])
def test_decompress_rejects_unknown_compression_ids(kind_id):
    with pytest.raises(RejectedDatagram) as exc:
        codec.decompress(kind_id, b"whatever")
    assert exc.value.reason == "bad_compression"


def test_compress_rejects_unknown_kind():
    with pytest.raises(ValueError):
        codec.compress("brotli", b"data")
