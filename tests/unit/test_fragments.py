"""diode.link.fragments: a record larger than a datagram crosses whole, or is reported lost; memory
stays bounded whatever the network delivers."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diode.link.crypto import TAG_BYTES
from diode.link.fragments import (
    FRAGMENT_HEADER,
    FRAGMENT_HEADER_BYTES,
    FRAGMENT_VERSION,
    Fragment,
    FragmentRejected,
    Reassembler,
    parse,
    split,
)
from diode.link.wire import HEADER_BYTES

MTU_CHUNK = 1472 - HEADER_BYTES - TAG_BYTES - FRAGMENT_HEADER_BYTES
MiB = 1024 * 1024


def payload_of(size, seed=0) -> bytes:
    return random.Random(seed).randbytes(size)


def feed(reassembler, session, bodies, now=0.0) -> list[bytes]:
    """Every payload the reassembler returned while fed `bodies` as received datagram bodies."""
    out = []
    for body in bodies:
        done = reassembler.add(session, parse(body), now)
        if done is not None:
            out.append(done)
    return out


def with_duplicates(bodies, rng):
    """`bodies` shuffled, with a third of them repeated, some after the group completed."""
    out = bodies + rng.sample(bodies, len(bodies) // 3)
    rng.shuffle(out)
    return out + rng.sample(bodies, min(5, len(bodies)))


ORDERS = {
    "in_order": lambda b, rng: list(b),
    "reversed": lambda b, rng: b[::-1],
    "shuffled": lambda b, rng: rng.sample(b, len(b)),
    "duplicated": with_duplicates,
}


@pytest.mark.parametrize("order", ORDERS)
def test_five_mib_record_over_1472_byte_datagrams_reassembles_byte_exact(order):
    payload = payload_of(5 * MiB)
    bodies = split(payload, group_id=42, chunk_bytes=MTU_CHUNK)
    assert len(bodies) == -(-len(payload) // MTU_CHUNK)
    assert all(HEADER_BYTES + TAG_BYTES + len(b) <= 1472 for b in bodies)
    r = Reassembler(max_record_bytes=8 * MiB)
    assert feed(r, 7, ORDERS[order](bodies, random.Random(3))) == [payload]
    assert (r.completed, r.groups, r.buffered_bytes) == (1, 0, 0)


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 200_000), data=st.data(), rng=st.randoms(use_true_random=False),
       order=st.sampled_from(sorted(ORDERS)))
def test_any_payload_and_chunk_size_reassembles_in_any_order(size, data, rng, order):
    # At most ~4000 fragments a group, so a hundred examples stay fast.
    chunk_bytes = data.draw(st.integers(max(1, size // 4000), max(1, size + 10)))
    payload = payload_of(size, seed=size)
    bodies = split(payload, group_id=data.draw(st.integers(0, 2**64 - 1)), chunk_bytes=chunk_bytes)
    r = Reassembler(max_record_bytes=size)
    assert feed(r, 1, ORDERS[order](bodies, rng)) == [payload]
    assert (r.groups, r.buffered_bytes) == (0, 0)


def test_a_lost_fragment_loses_the_record_which_expire_reports_and_memory_is_freed():
    bodies = split(payload_of(10_000), group_id=99, chunk_bytes=1000)
    lost = bodies.pop(4)
    r = Reassembler(max_record_bytes=MiB, timeout=10.0)
    assert feed(r, 5, bodies, now=100.0) == []
    assert r.groups == 1 and r.buffered_bytes == 9_000
    assert r.expire(105.0) == []  # still within the timeout: kept
    assert r.expire(111.0) == [(5, 99, 9, 10)]
    assert (r.groups, r.buffered_bytes, r.expired, r.completed) == (0, 0, 1, 0)
    # The lost fragment arriving late does not open a group that could never complete.
    assert feed(r, 5, [lost], now=112.0) == []
    assert r.groups == 0 and r.expire(1000.0) == []


def test_timeout_counts_from_the_last_new_fragment_so_a_slow_record_still_completes():
    payload = payload_of(10_000)
    bodies = split(payload, group_id=1, chunk_bytes=1000)
    r = Reassembler(max_record_bytes=MiB, timeout=10.0)
    out = []
    for i, body in enumerate(bodies):  # one fragment every 5 s: 45 s in all
        out += feed(r, 1, [body], now=5.0 * i)
        assert r.expire(5.0 * i + 1) == []
    assert out == [payload]


def test_two_sessions_with_the_same_group_id_do_not_mix():
    a, b = payload_of(30_000, seed=1), payload_of(20_000, seed=2)
    fa = [(1, body) for body in split(a, 7, 1000)]
    fb = [(2, body) for body in split(b, 7, 1000)]
    interleaved = [x for pair in zip(fa, fb) for x in pair] + fa[len(fb):]
    r = Reassembler(max_record_bytes=MiB)
    done = {}
    for session, body in interleaved:
        out = r.add(session, parse(body), now=0.0)
        if out is not None:
            done[session] = out
    assert done == {1: a, 2: b}
    assert r.buffered_bytes == 0


def test_a_record_over_max_record_bytes_is_refused_and_nothing_is_buffered():
    r = Reassembler(max_record_bytes=1000)
    bodies = split(payload_of(1001), group_id=3, chunk_bytes=100)
    with pytest.raises(FragmentRejected) as exc:
        r.add(1, parse(bodies[5]), now=0.0)
    assert exc.value.reason == "record_too_large"
    assert isinstance(exc.value, ValueError)
    assert "1001" in str(exc.value)
    # The rest of the group is dropped quietly (refused once, counted once).
    assert feed(r, 1, bodies) == []
    assert (r.groups, r.buffered_bytes, r.rejected) == (0, 0, 1)
    # A record of exactly the limit crosses.
    exact = payload_of(1000)
    assert feed(r, 1, split(exact, group_id=4, chunk_bytes=100)) == [exact]


def frag(index, count, total, chunk, group=8):
    return Fragment(group, index, count, total, chunk)


@pytest.mark.parametrize("first, second", [
    # another count or total than the group's earlier fragments
    (frag(0, 3, 30, b"x" * 10), frag(1, 4, 30, b"x" * 10)),
    (frag(0, 3, 30, b"x" * 10), frag(1, 3, 31, b"x" * 10)),
    # chunks that overflow the announced total, or that leave too little for the rest
    (frag(0, 3, 30, b"x" * 10), frag(1, 3, 30, b"x" * 25)),
    (frag(0, 3, 30, b"x" * 10), frag(1, 3, 30, b"x" * 20)),
    # every fragment arrived but the lengths fall short of the total
    (frag(0, 2, 30, b"x" * 10), frag(1, 2, 30, b"x" * 10)),
])
def test_inconsistent_fragments_are_refused_and_their_group_dropped(first, second):
    r = Reassembler(max_record_bytes=MiB)
    assert r.add(1, first, now=0.0) is None
    with pytest.raises(FragmentRejected) as exc:
        r.add(1, second, now=0.0)
    assert exc.value.reason == "inconsistent_fragment"
    assert (r.groups, r.buffered_bytes) == (0, 0)
    # The other fragment of the pair cannot revive the group, nor yield a wrong payload.
    assert r.add(1, frag(2, 3, 30, b"x" * 10), now=0.0) is None
    assert r.groups == 0


def test_a_single_inconsistent_fragment_is_refused_before_it_costs_memory():
    r = Reassembler(max_record_bytes=MiB, max_groups=1)
    r.add(1, frag(0, 2, 20, b"a" * 10, group=1), now=0.0)
    with pytest.raises(FragmentRejected) as exc:
        r.add(1, frag(0, 2, 20, b"b" * 20, group=2), now=0.0)  # leaves nothing for fragment 1
    assert exc.value.reason == "inconsistent_fragment"
    assert r.evicted == 0 and r.groups == 1  # the good group was not evicted to make room


def test_many_incomplete_groups_stay_within_max_groups_and_the_oldest_are_evicted():
    r = Reassembler(max_record_bytes=10_000, max_groups=8)
    groups = {g: split(payload_of(10_000, seed=g), g, 1000) for g in range(100)}
    for g, bodies in groups.items():
        feed(r, 1, bodies[:3], now=float(g))
        assert r.groups <= 8
    assert r.evicted == 92
    # Evicted groups are reported once, like expired ones: each is a lost record.
    reported = r.expire(100.0)
    assert sorted(g for _, g, _, _ in reported) == list(range(92))
    assert all(received == 3 and count == 10 for _, _, received, count in reported)
    # The newest survive and complete; the oldest cannot.
    assert feed(r, 1, groups[99][3:], now=100.0) == [payload_of(10_000, seed=99)]
    assert feed(r, 1, groups[0][3:], now=100.0) == []


def test_buffered_bytes_never_exceed_max_bytes_and_the_least_recently_fed_are_evicted():
    r = Reassembler(max_record_bytes=10_000, max_bytes=50_000, max_groups=1000)
    groups = {g: split(payload_of(10_000, seed=g), g, 1000) for g in range(50)}
    for g, bodies in groups.items():
        for body in bodies[:5]:
            r.add(1, parse(body), now=float(g))
            assert r.buffered_bytes <= 50_000
    assert (r.buffered_bytes, r.groups, r.evicted) == (50_000, 10, 40)
    # Group 40, the oldest, makes progress: room is made by evicting group 41 instead, and
    # group 40 completes.
    assert feed(r, 1, groups[40][5:], now=60.0) == [payload_of(10_000, seed=40)]
    assert r.evicted == 41
    assert feed(r, 1, groups[41][5:], now=60.0) == []
    assert feed(r, 1, groups[42][5:], now=60.0) == [payload_of(10_000, seed=42)]
    assert r.buffered_bytes <= 50_000


def test_split_refuses_what_cannot_be_fragmented():
    with pytest.raises(ValueError, match="chunk_bytes"):
        split(b"abc", 1, 0)
    with pytest.raises(ValueError, match="empty"):
        split(b"", 1, 100)
    with pytest.raises(ValueError, match="64 bits"):
        split(b"abc", 2**64, 100)


def header(version=FRAGMENT_VERSION, group=1, index=0, count=1, total=3):
    return FRAGMENT_HEADER.pack(version, group, index, count, total)


@pytest.mark.parametrize("body, words", [
    (header()[:-1], "shorter than"),
    (header(version=2) + b"abc", "version 2"),
    (header(count=0) + b"abc", "count is 0"),
    (header(index=1, count=1) + b"abc", "index"),
    (header(total=0) + b"abc", "total payload length is 0"),
    (header(count=4, index=0, total=3) + b"abc", "cannot carry"),
    (header(), "empty chunk"),
    (header(total=2, count=1) + b"abc", "longer than"),
])
def test_parse_names_what_is_wrong_with_a_malformed_fragment(body, words):
    with pytest.raises(FragmentRejected, match=words) as exc:
        parse(body)
    assert exc.value.reason == "malformed_fragment"


def test_parse_reads_back_what_split_wrote():
    bodies = split(b"0123456789", group_id=2**64 - 1, chunk_bytes=4)
    assert [parse(b) for b in bodies] == [
        Fragment(2**64 - 1, 0, 3, 10, b"0123"),
        Fragment(2**64 - 1, 1, 3, 10, b"4567"),
        Fragment(2**64 - 1, 2, 3, 10, b"89"),
    ]
    assert parse(memoryview(bytearray(bodies[2]))) == parse(bodies[2])


@settings(max_examples=500, deadline=None)
@given(body=st.one_of(
    st.binary(max_size=80),
    st.binary(min_size=FRAGMENT_HEADER_BYTES - 1, max_size=80).map(
        lambda b: bytes([FRAGMENT_VERSION]) + b)))
def test_parse_of_arbitrary_bytes_raises_only_value_error(body):
    try:
        f = parse(body)
    except ValueError:
        return
    # Whatever is accepted describes a fragment `split` could have made.
    assert 0 <= f.index < f.count <= f.total
    assert 1 <= len(f.chunk) <= f.total
    r = Reassembler(max_record_bytes=2**64, max_bytes=2**64)
    try:
        r.add(1, f, now=0.0)
    except FragmentRejected as exc:
        assert exc.reason in ("inconsistent_fragment", "record_too_large")
    assert r.buffered_bytes <= f.total
