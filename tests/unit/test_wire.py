"""diode.link.wire: the datagram format, end to end through compression and encryption."""

import io
import os
import struct

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from diode.link import codec, crypto, runs, wire
from diode.errors import RejectedDatagram
from diode.link.records import Record

MASTER = os.urandom(32)
CIPHERS = ["none", "aes-256-gcm", "chacha20-poly1305"]
COMPRESSIONS = ["none", "gzip", "zstd", "lz4"]

BATCH = [
    Record("orders", 0, 10, 1_700_000_000_000, 1, b"k1", b"v1" * 50, (("h", b"x"),)),
    Record("orders", 0, 11, 1_700_000_000_001, 1, None, None, (("n", None),)),
    Record("\u00fcber", 4, 0, -1, 0, b"", b"\x00" * 300, ()),
]
COUNTS = {"orders": 2, "\u00fcber": 5}
PAYLOAD = runs.encode_records(BATCH, COUNTS)


def sealer(cipher="aes-256-gcm", compression="none", session=None):
    cid = crypto.CIPHER_IDS[cipher]
    sid = crypto.new_session_id() if session is None else session
    return wire.Sealer(crypto.SessionCipher(cid, MASTER if cid else None, sid), compression)


def keyring(cipher="aes-256-gcm"):
    cid = crypto.CIPHER_IDS[cipher]
    return crypto.Keyring(cid, MASTER if cid else None)


@pytest.mark.parametrize("cipher", CIPHERS)
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip(cipher, compression):
    s = sealer(cipher, compression)
    datagram = s.seal(PAYLOAD)
    h = wire.parse_header(datagram)

    assert (h.kind, h.cipher, h.compression) == (
        wire.KIND_DATA, crypto.CIPHER_IDS[cipher], codec.COMPRESSION_IDS[compression])
    assert h.session_id == s.cipher.session_id
    assert wire.open_datagram(datagram, keyring(cipher)) == (BATCH, COUNTS)


@pytest.mark.parametrize("cipher", ["aes-256-gcm", "chacha20-poly1305"])
def test_encrypted_datagrams_hide_the_records(cipher):
    datagram = sealer(cipher).seal(PAYLOAD)
    assert b"orders" not in datagram and b"v1v1" not in datagram
    assert len(datagram) == wire.HEADER_BYTES + len(PAYLOAD) + crypto.TAG_BYTES


def test_plaintext_datagram_is_header_plus_payload():
    datagram = sealer("none").seal(PAYLOAD)
    assert datagram == datagram[:wire.HEADER_BYTES] + PAYLOAD
    assert wire.parse_header(datagram).cipher == 0


@pytest.mark.parametrize("buffer", [bytearray, memoryview])
def test_open_accepts_receive_buffers(buffer):
    """The udp_reader hands over slices of a recv_into buffer, not bytes."""
    datagram = sealer().seal(PAYLOAD)
    assert wire.open_datagram(buffer(bytearray(datagram)), keyring()) == (BATCH, COUNTS)
    assert wire.routing_key(buffer(bytearray(datagram))) == wire.parse_header(datagram).routing_key


def test_sequence_numbers_strictly_increase_and_route():
    s = sealer()
    headers = [wire.parse_header(s.seal(PAYLOAD)) for _ in range(50)]
    seqs = [h.seq for h in headers]
    assert seqs == sorted(set(seqs)) and seqs[0] >= 1
    assert len({h.session_id for h in headers}) == 1
    # consecutive datagrams spread over the unpackers
    assert len({h.routing_key % 4 for h in headers}) == 4


def test_two_sealers_never_share_a_nonce():
    """Two packers (or one packer restarted) with the same master key must not reuse a
    (session key, nonce) pair: each draws its own session id."""
    a, b = sealer(), sealer()
    pairs = set()
    for s in (a, b):
        for _ in range(20):
            h = wire.parse_header(s.seal(PAYLOAD))
            pairs.add((h.session_id, h.seq))
    assert a.cipher.session_id != b.cipher.session_id
    assert len(pairs) == 40
    # and the ciphertexts of the same payload differ
    assert a.seal(PAYLOAD)[wire.HEADER_BYTES:] != b.seal(PAYLOAD)[wire.HEADER_BYTES:]


def test_wrong_key_is_rejected():
    datagram = sealer().seal(PAYLOAD)
    with pytest.raises(RejectedDatagram) as exc:
        wire.open_datagram(datagram, crypto.Keyring(1, os.urandom(32)))
    assert exc.value.reason == "auth_failed"


def test_plaintext_datagram_is_rejected_by_an_encrypting_receiver():
    datagram = sealer("none").seal(PAYLOAD)
    with pytest.raises(RejectedDatagram) as exc:
        wire.open_datagram(datagram, keyring("aes-256-gcm"))
    assert exc.value.reason == "wrong_cipher"


# -- header parsing ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 2, wire.HEADER_BYTES - 1])
def test_parse_header_rejects_truncated(size):
    datagram = sealer().seal(PAYLOAD)[:size]
    for parse in (wire.parse_header, wire.routing_key):
        with pytest.raises(RejectedDatagram) as exc:
            parse(datagram)
        assert exc.value.reason == "truncated"


def test_parse_header_rejects_bad_magic():
    datagram = b"\x00\x00" + sealer().seal(PAYLOAD)[2:]
    with pytest.raises(RejectedDatagram) as exc:
        wire.parse_header(datagram)
    assert exc.value.reason == "bad_magic"


@pytest.mark.parametrize("version", [0, 1, 2, 4, 255])  # 1, 2: before runs, before incarnations
def test_parse_header_rejects_bad_version(version):
    datagram = bytearray(sealer().seal(PAYLOAD))
    datagram[2] = version
    with pytest.raises(RejectedDatagram) as exc:
        wire.parse_header(bytes(datagram))
    assert exc.value.reason == "bad_version"


def test_header_is_28_bytes_and_packs_what_it_parses():
    h = wire.Header(wire.KIND_DATA, 1, 2, 3, 2**64 - 1, 2**63, 2**32 - 1)
    packed = h.pack()
    assert len(packed) == wire.HEADER_BYTES == 28
    assert packed[:2] == wire.MAGIC
    assert wire.parse_header(packed) == h


def test_open_rejects_unknown_kind():
    datagram = bytearray(sealer("none").seal(PAYLOAD))
    datagram[3] = 9
    with pytest.raises(RejectedDatagram) as exc:
        wire.open_datagram(bytes(datagram), keyring("none"))
    assert exc.value.reason == "bad_kind"


# -- nothing but RejectedDatagram, whatever arrives ---------------------------------------------

VALID = {c: sealer(c, "zstd").seal(PAYLOAD) for c in CIPHERS}
AES = VALID["aes-256-gcm"]


def opens_or_rejects(datagram, ring):
    try:
        return wire.open_datagram(datagram, ring)
    except RejectedDatagram:
        return None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(CIPHERS))
def test_random_bytes_are_rejected(data, cipher):
    result = opens_or_rejects(data, keyring(cipher))
    if cipher != "none":
        assert result is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120), st.sampled_from(CIPHERS))
def test_random_bodies_behind_a_valid_header_are_rejected(body, cipher):
    datagram = VALID[cipher][:wire.HEADER_BYTES] + body
    result = opens_or_rejects(datagram, keyring(cipher))
    if cipher != "none":
        assert result is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CIPHERS), st.data())
def test_truncations_are_rejected(cipher, data):
    valid = VALID[cipher]
    cut = data.draw(st.integers(0, len(valid) - 1))
    result = opens_or_rejects(valid[:cut], keyring(cipher))
    if cipher != "none":
        assert result is None


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(AES) * 8 - 1))
def test_every_bit_flip_of_an_aes_gcm_datagram_is_rejected(bit):
    datagram = bytearray(AES)
    datagram[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(RejectedDatagram):
        wire.open_datagram(bytes(datagram), keyring("aes-256-gcm"))


def test_every_bit_flip_of_an_aes_gcm_datagram_is_rejected_exhaustively():
    ring = keyring("aes-256-gcm")
    for bit in range(len(AES) * 8):
        datagram = bytearray(AES)
        datagram[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(RejectedDatagram):
            wire.open_datagram(bytes(datagram), ring)
    assert wire.open_datagram(AES, ring) == (BATCH, COUNTS)  # the original still opens


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["none", "chacha20-poly1305"]), st.data())
def test_bit_flips_never_raise_anything_else(cipher, data):
    valid = VALID[cipher]
    bit = data.draw(st.integers(0, len(valid) * 8 - 1))
    datagram = bytearray(valid)
    datagram[bit // 8] ^= 1 << (bit % 8)
    result = opens_or_rejects(bytes(datagram), keyring(cipher))
    if cipher != "none":
        assert result is None


def test_replayed_header_with_another_sessions_body_is_rejected():
    a, b = sealer(), sealer()
    da, db = a.seal(PAYLOAD), b.seal(PAYLOAD)
    spliced = da[:wire.HEADER_BYTES] + db[wire.HEADER_BYTES:]
    with pytest.raises(RejectedDatagram) as exc:
        wire.open_datagram(spliced, keyring())
    assert exc.value.reason == "auth_failed"


def test_header_layout_matches_the_documented_struct():
    s = sealer(session=0x0102030405060708)
    datagram = s.seal(PAYLOAD)
    magic, version, kind, cipher, compression, key_id, flags, session, seq, routing = \
        struct.unpack("!2sBBBBBBQQI", datagram[:28])
    assert (magic, version, kind) == (b"\xd1\x0d", 3, 1)
    assert (cipher, compression, key_id, flags) == (1, 0, 0, 0)
    assert (session, seq, routing) == (0x0102030405060708, 1, 1)


def test_heartbeat_round_trip_and_garbage():
    topic_id = bytes(range(16))
    beat = {"reader": 1, "time_ms": 1_795_300_000_000, "interval_ms": 1000,
            "cluster": "en1V5N-gTDaRDHdxgulpSA",
            "partitions": [("orders", 3, topic_id, 100, 250, 300, False),
                           ("\u00fcber", 0, b"\xff" * 16, 0, 0, 7, True)],
            "counters": {"records": 123, "rewinds": 0, "inflight": 7}}
    back = wire.decode_heartbeat(wire.encode_heartbeat(beat))
    assert back == {**beat, "interval_ms": 1000.0}
    encoded = wire.encode_heartbeat(beat)
    for bad in (encoded[:-1], encoded + b"\x00", b"", b"\xff" * 20):
        with pytest.raises(RejectedDatagram) as exc:
            wire.decode_heartbeat(bad)
        assert exc.value.reason == "decode_failed"


def test_source_state_round_trip_and_garbage():
    state = {"reader": 0, "time_ms": 1_795_300_000_000, "cluster": "c",
             "partitions": [("orders", 3, bytes(range(16)), 40, 300)],
             "topics": [("orders", 604800000, -1, "delete"),
                        ("\u00fcber", wire.UNKNOWN, wire.UNKNOWN, "")]}
    encoded = wire.encode_source(state)
    assert wire.decode_source(encoded) == state
    for bad in (encoded[:-1], encoded + b"\x00", b"", b"\xff" * 20):
        with pytest.raises(RejectedDatagram) as exc:
            wire.decode_source(bad)
        assert exc.value.reason == "decode_failed"


def test_a_heartbeat_says_when_each_claims_chain_was_first_named_and_an_older_one_does_not():
    """When each claim's chain was first named crosses in the counters, which the schema
    already has (a receiver that does not know them passes them on as counters; one that does
    takes them out); a heartbeat of an older sender has none, and says nothing of it."""
    inc = bytes(range(16))
    claims = [("t", p, inc, 0, 9, 9, False) for p in range(5)]
    beat = {"reader": 0, "time_ms": 5000, "interval_ms": 1000, "cluster": "c",
            "partitions": claims, "counters": {"records": 45}}
    named = [1000, 1000, 4000, 1000, 1000]
    encoded = wire.encode_heartbeat({**beat, "named_ms": named})
    older = fastavro.schemaless_reader(io.BytesIO(encoded), wire.HEARTBEAT_SCHEMA)
    assert [c["last_sent"] for c in older["partitions"]] == [9] * 5  # (the claims as before)
    assert len(older["counters"]) == 4  # (records, and where the times change: 3)
    back = wire.decode_heartbeat(encoded)
    assert back["named_ms"] == named and back["counters"] == {"records": 45}
    assert back["partitions"] == claims
    assert "named_ms" not in wire.decode_heartbeat(wire.encode_heartbeat(beat))
    for wrong in ({"named_ms@1": 1000}, {"named_ms@0": 1000, "named_ms@5": 1},
                  {"named_ms@x": 1000}):
        bad = wire.encode_heartbeat({**beat, "counters": {"records": 45, **wrong}})
        with pytest.raises(RejectedDatagram) as exc:
            wire.decode_heartbeat(bad)
        assert exc.value.reason == "decode_failed"
