"""diode.link.codec: the compression around datagram payloads, bounded on the way in."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from diode.link import codec, runs
from diode.errors import RejectedDatagram
from diode.link.records import Record

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
    payload = runs.encode_records([r._replace(offset=i, prev_offset=i - 1) for i in range(50)])
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
