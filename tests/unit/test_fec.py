"""diode.link.fec: lost data datagrams come back byte for byte from parity, bursts included, and the
receiver's memory stays bounded whatever arrives."""

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diode.link.fec import (
    ENTRY,
    PARITY_HEADER,
    BlockDecoder,
    BlockEncoder,
    Parity,
    decode_parity,
    encode_parity,
)

SESSION = 0x1234


def datagram(seq: int, rng: random.Random, longest: int = 300) -> bytes:
    """A stand-in for a sealed datagram: distinct per seq, of random length."""
    return struct.pack("!Q", seq) + rng.randbytes(rng.randrange(0, longest))


def send(enc: BlockEncoder, count: int, rng: random.Random, flush: bool = True,
         first_seq: int = 1) -> list[tuple]:
    """What a packer would put on the wire, in order: ("data", block, seq, bytes) and
    ("parity", block, payload). Parity goes right after the add() that returned it."""
    stream = []
    for seq in range(first_seq, first_seq + count):
        block = enc.assign()
        d = datagram(seq, rng)
        stream.append(("data", block, seq, d))
        stream.extend(("parity", p.block_id, p.payload) for p in enc.add(block, seq, d))
        assert enc.held <= enc.depth * enc.k
    if flush:
        stream.extend(("parity", p.block_id, p.payload) for p in enc.flush())
    return stream


def receive(dec: BlockDecoder, stream: list[tuple], now: float = 0.0) -> list[bytes]:
    """Feed what arrived; return every datagram the decoder rebuilt, in order."""
    out = []
    for item in stream:
        if item[0] == "data":
            out += dec.data(SESSION, item[1], item[2], item[3], now)
        else:
            p = decode_parity(item[2])
            assert p.block_id == item[1]      # the routing key the packer puts in the header
            out += dec.parity(SESSION, p, now)
    return out


def lost_data(stream: list[tuple], lost: set[int]) -> dict[int, bytes]:
    return {stream[i][2]: stream[i][3] for i in lost if stream[i][0] == "data"}


def by_block(stream: list[tuple]) -> dict[int, list[int]]:
    """Positions in the stream of every block's datagrams, data and parity."""
    blocks: dict[int, list[int]] = {}
    for i, item in enumerate(stream):
        blocks.setdefault(item[1], []).append(i)
    return blocks


@settings(max_examples=100, deadline=None)
@given(k=st.integers(1, 12), m=st.integers(1, 4), depth=st.integers(1, 4),
       count=st.integers(1, 80), rng=st.randoms(use_true_random=False))
def test_up_to_m_losses_per_block_are_recovered_byte_exact(k, m, depth, count, rng):
    stream = send(BlockEncoder(k, m, depth), count, rng)
    lost = set()
    for positions in by_block(stream).values():
        lost |= set(rng.sample(positions, rng.randint(0, m)))
    dec = BlockDecoder()
    rebuilt = receive(dec, [x for i, x in enumerate(stream) if i not in lost])
    expected = lost_data(stream, lost)
    assert sorted(rebuilt) == sorted(expected.values())
    assert dec.recovered == len(expected)
    dec.expire(now=100.0)     # blocks whose parity was all lost waited for it until now
    assert dec.blocks_unrecoverable == 0
    assert dec.open_blocks == 0 and dec.buffered_bytes == 0


@settings(max_examples=100, deadline=None)
@given(k=st.integers(1, 10), m=st.integers(1, 3), depth=st.integers(1, 3),
       count=st.integers(1, 60), rng=st.randoms(use_true_random=False))
def test_too_many_losses_recover_nothing_wrong_and_count_as_unrecoverable(k, m, depth, count,
                                                                          rng):
    stream = send(BlockEncoder(k, m, depth), count, rng)
    lost, fixable, unrecoverable = set(), set(), 0
    for positions in by_block(stream).values():
        gone = set(rng.sample(positions, rng.randint(0, len(positions))))
        lost |= gone
        data_lost = sum(stream[i][0] == "data" for i in gone)
        parity_in = sum(stream[i][0] == "parity" for i in positions if i not in gone)
        if data_lost <= parity_in:
            fixable |= {stream[i][2] for i in gone if stream[i][0] == "data"}
        elif parity_in:
            unrecoverable += 1         # parity says what is missing, and it cannot fill it
    dec = BlockDecoder(timeout=2.0)
    rebuilt = receive(dec, [x for i, x in enumerate(stream) if i not in lost], now=0.0)
    expected = lost_data(stream, lost)
    assert len(rebuilt) == len(set(rebuilt))                  # each at most once
    assert sorted(rebuilt) == sorted(expected[s] for s in fixable)   # never garbage
    assert dec.expire(now=1.0) == 0                           # not yet timed out
    dec.expire(now=3.0)
    assert dec.blocks_unrecoverable == unrecoverable
    assert dec.open_blocks == 0 and dec.buffered_bytes == 0


def test_dropping_m_plus_one_data_datagrams_of_a_block_returns_nothing_for_it():
    rng = random.Random(7)
    stream = send(BlockEncoder(k=6, m=2), 6, rng)     # one block, its 2 parity at the end
    dec = BlockDecoder()
    assert receive(dec, stream[3:]) == []             # lost 3 data datagrams > m
    assert dec.recovered == 0 and dec.open_blocks == 1
    assert dec.expire(now=10.0) == 1
    assert dec.blocks_unrecoverable == 1 and dec.buffered_bytes == 0


def interleaved(depth: int) -> list[tuple]:
    return send(BlockEncoder(k=8, m=2, depth=depth), 320, random.Random(depth))


@pytest.mark.parametrize("data_only", [True, False], ids=["burst-of-data", "burst-on-the-wire"])
def test_with_depth_4_any_burst_of_8_is_recovered(data_only):
    stream = interleaved(depth=4)
    candidates = [i for i, x in enumerate(stream) if x[0] == "data" or not data_only]
    for start in range(len(candidates) - 8 + 1):
        lost = set(candidates[start:start + 8])
        rebuilt = receive(BlockDecoder(), [x for i, x in enumerate(stream) if i not in lost])
        assert sorted(rebuilt) == sorted(lost_data(stream, lost).values()), f"burst at {start}"


def test_with_depth_1_the_same_burst_is_not_recovered():
    stream = interleaved(depth=1)
    data = [i for i, x in enumerate(stream) if x[0] == "data"]
    for candidates in (data, list(range(len(stream)))):
        for start in range(0, len(candidates) - 8 + 1, 3):
            lost = set(candidates[start:start + 8])
            rebuilt = receive(BlockDecoder(), [x for i, x in enumerate(stream) if i not in lost])
            assert len(rebuilt) < len(lost_data(stream, lost))


def test_a_partial_block_flushed_is_recovered():
    enc = BlockEncoder(k=8, m=2, depth=3)
    rng = random.Random(3)
    stream = send(enc, 13, rng)                       # blocks of 5, 4 and 4 datagrams, flushed
    parity = [decode_parity(x[2]) for x in stream if x[0] == "parity"]
    assert sorted(p.k for p in parity) == [4, 4, 4, 4, 5, 5]
    assert enc.held == 0 and enc.flush() == []
    assert enc.assign() not in {p.block_id for p in parity}   # new blocks after a flush
    lost = set()
    for positions in by_block(stream).values():
        lost |= set(positions[:2])                    # two data datagrams of every block
    rebuilt = receive(BlockDecoder(), [x for i, x in enumerate(stream) if i not in lost])
    assert sorted(rebuilt) == sorted(lost_data(stream, lost).values())
    assert len(rebuilt) == 6


def test_parity_before_data_late_data_and_duplicate_parity_recover_each_datagram_once():
    rng = random.Random(5)
    stream = send(BlockEncoder(k=4, m=2), 4, rng)
    data = [x for x in stream if x[0] == "data"]
    parity = [x for x in stream if x[0] == "parity"]
    dec = BlockDecoder()
    # parity first, twice: nothing to rebuild from yet
    assert receive(dec, parity + parity) == []
    # then two data datagrams: with the parity, enough to rebuild the other two, once
    assert receive(dec, data[:2]) == [data[2][3], data[3][3]]
    # those arrive late after all, parity again: no crash, nothing new, nothing held
    assert receive(dec, data[2:] + parity + data) == []
    assert dec.recovered == 2 and dec.open_blocks == 0 and dec.buffered_bytes == 0


def test_a_block_whose_data_all_arrived_is_forgotten_at_its_first_parity():
    rng = random.Random(6)
    stream = send(BlockEncoder(k=4, m=3, depth=2), 8, rng, flush=False)
    dec = BlockDecoder()
    assert receive(dec, stream[:9]) == []     # 8 data, then block 0's first parity
    assert dec.open_blocks == 1               # only block 1 waits for its parity
    assert receive(dec, stream[9:]) == [] and dec.open_blocks == 0 and dec.recovered == 0


def test_memory_stays_bounded_whatever_arrives():
    rng = random.Random(8)
    dec = BlockDecoder(max_blocks=100, max_bytes=64 * 1024, timeout=2.0)
    payload = rng.randbytes(1500)
    for n in range(100_000):                  # distinct blocks, parity never comes
        dec.data(SESSION, n & 0xFFFFFFFF, n + 1, payload[:rng.randrange(1, 1500)], now=n / 1e4)
        assert dec.open_blocks <= 100 and dec.buffered_bytes <= 64 * 1024
    assert dec.evicted > 99_000
    assert len(dec._done) <= 4 * 100          # the markers of dropped blocks are bounded too
    for seq in range(1, 10_000):              # one block, many datagrams before its parity
        dec.data(SESSION + 1, 7, seq, payload, now=11.0)
    assert dec.buffered_bytes <= 64 * 1024
    dec.expire(now=20.0)
    assert dec.open_blocks == 0 and dec.buffered_bytes == 0
    dec.expire(now=30.0)                      # done markers time out as well
    assert len(dec._done) == 0


def test_a_block_bigger_than_max_bytes_evicts_others_and_never_exceeds():
    rng = random.Random(9)
    stream = send(BlockEncoder(k=10, m=2), 10, rng)
    dec = BlockDecoder(max_bytes=1000)
    receive(dec, stream)
    assert dec.buffered_bytes <= 1000


def valid_parity(**change) -> bytes:
    return encode_parity(Parity(9, 3, 2, 1, (10, 12, 14), (5, 7, 2), b"\xaa" * 7)._replace(
        **change))


def test_parity_payload_round_trip_and_layout():
    payload = valid_parity()
    assert len(payload) == PARITY_HEADER.size + 3 * ENTRY.size + 7 == 12 + 30 + 7
    assert payload[:12] == bytes([1, 3, 2, 1]) + struct.pack("!II", 7, 9)
    assert decode_parity(payload) == Parity(9, 3, 2, 1, (10, 12, 14), (5, 7, 2), b"\xaa" * 7)
    assert decode_parity(memoryview(bytearray(payload))).seqs == (10, 12, 14)


def patched(offset: int, value: bytes) -> bytes:
    p = bytearray(valid_parity())
    p[offset:offset + len(value)] = value
    return bytes(p)


@pytest.mark.parametrize("payload, message", [
    (b"", "truncated"),
    (valid_parity()[:11], "truncated"),
    (valid_parity()[:-1], "bytes, but"),
    (valid_parity() + b"\0", "bytes, but"),
    (patched(0, b"\x02"), "version 2"),
    (patched(1, b"\x00"), "k=0"),
    (patched(2, b"\x00"), "m=0"),
    (patched(3, b"\x02"), "index 2"),
    (patched(1, b"\xff\xff"), r"k \+ m"),
    (patched(4, struct.pack("!I", 8)), "bytes, but"),                  # padded != stated
    (patched(12 + 8, struct.pack("!H", 8)), "longest datagram"),       # a length > padded
    (patched(12 + 10 + 8, struct.pack("!H", 3)), "longest datagram"),  # padded > longest
    (patched(12 + 10, struct.pack("!Q", 10)), "strictly increasing"),
])
def test_malformed_parity_is_rejected_with_a_reason(payload, message):
    with pytest.raises(ValueError, match=message):
        decode_parity(payload)


def test_every_truncation_of_a_parity_payload_is_rejected():
    payload = valid_parity()
    for n in range(len(payload)):
        with pytest.raises(ValueError):
            decode_parity(payload[:n])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.builds(lambda head, tail: head + tail,
                           st.sampled_from([valid_parity()[:12], bytes([1, 1, 1, 0, 0, 0, 0, 3,
                                                                        0, 0, 0, 0])]),
                           st.binary(max_size=60))))
def test_random_bytes_raise_nothing_but_value_error(payload):
    try:
        p = decode_parity(payload)
    except ValueError:
        return
    assert encode_parity(p) == payload       # what is accepted is exactly what was sent


def test_fec_off_sends_and_keeps_nothing():
    enc = BlockEncoder(k=1, m=0, depth=4)
    rng = random.Random(10)
    ids = set()
    for seq in range(1, 101):
        ids.add(enc.assign())
        assert enc.add(enc.assign(), seq, datagram(seq, rng)) == []
        assert enc.held == 0
    assert enc.flush() == [] and not enc.enabled
    assert len(ids) == 100                   # each datagram its own routing key


def test_encoder_refuses_misuse_with_context():
    with pytest.raises(ValueError, match="k=0"):
        BlockEncoder(0, 2)
    with pytest.raises(ValueError, match="m=250"):
        BlockEncoder(10, 250)
    enc = BlockEncoder(4, 2, depth=2)
    with pytest.raises(ValueError, match="belongs to block 0"):
        enc.add(1, 1, b"x")
    enc.add(enc.assign(), 5, b"x")
    with pytest.raises(ValueError, match="increase strictly"):
        enc.add(enc.assign(), 5, b"y")


def test_block_ids_wrap_at_32_bits():
    enc = BlockEncoder(k=2, m=1, depth=2, first_block=0xFFFFFFFF)
    rng = random.Random(11)
    stream = send(enc, 8, rng)
    assert [x[1] for x in stream if x[0] == "data"][:4] == [0xFFFFFFFF, 0, 0xFFFFFFFF, 0]
    lost = {0, 1}                            # one data datagram of each of the first two blocks
    rebuilt = receive(BlockDecoder(), [x for i, x in enumerate(stream) if i not in lost])
    assert sorted(rebuilt) == sorted(lost_data(stream, lost).values())
