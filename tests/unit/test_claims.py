"""What a reader's heartbeats claim (diode.kafka.claims): what changed at once, the rest in
turn, every claim at least every K heartbeats, all of them when stopping."""

import math

from diode.kafka.claims import ClaimSlices

INC = b"\x01" * 16


def claims(n: int, last: dict | None = None) -> list:
    """A claim per partition 0..n-1 of topic t, its last offset sent 9 or as `last` says."""
    last = last or {}
    return [("t", p, INC, 0, last.get(p, 9), 9, False) for p in range(n)]


def beat(slices: ClaimSlices, current: list, whole: bool = False, now_ms: int = 0) -> set:
    chosen = slices.choose(current, whole)
    slices.carried_now(chosen, now_ms)
    return {c[1] for c in chosen}


def test_every_partition_is_claimed_within_k_beats_and_a_change_at_once():
    n, most = 103, 10
    slices = ClaimSlices(most)
    assert beat(slices, claims(n)) == set(range(n))  # (the first: every claim is new)
    k = math.ceil(n / most)
    assert slices.every() == k
    last = {}
    for round_ in range(3):
        claimed: list = []
        for i in range(k):
            changed = (round_ * 37 + i * 11) % n
            last[changed] = last.get(changed, 9) + 1
            got = beat(slices, claims(n, last))
            assert changed in got  # (new records sent: claimed in the next beat)
            assert len(got) <= most + 1
            claimed.append(got)
        assert set().union(*claimed) == set(range(n))  # (each within K beats)


def test_beats_rotate_through_partitions_that_come_and_go():
    slices = ClaimSlices(4)
    beat(slices, claims(10))
    since = {p: 0 for p in range(10)}  # beats since each was last claimed
    current = claims(10)
    for i in range(40):
        if i == 5:
            current = [c for c in current if c[1] not in (1, 2, 3)]  # (rewound, recreated)
        if i == 12:
            current = current + [("u", 0, INC, 0, 5, 5, False)]
        got = slices.choose(current)
        slices.carried_now(got, i)
        for p in since:
            since[p] += 1
        for c in got:
            since[c[1]] = 0
        live = {c[1] for c in current if c[0] == "t"}
        assert max(since[p] for p in live) < slices.every(), (i, since)


def test_stopping_beats_and_small_counts_claim_everything_and_no_bound_is_every_beat():
    slices = ClaimSlices(5)
    beat(slices, claims(50))
    assert len(beat(slices, claims(50))) == 5
    assert beat(slices, claims(50), whole=True) == set(range(50))
    assert beat(ClaimSlices(5), claims(5)) == beat(ClaimSlices(5), claims(5)) == set(range(5))
    unbounded = ClaimSlices(0)
    for _ in range(3):
        assert beat(unbounded, claims(50)) == set(range(50))


def test_a_claim_not_handed_on_is_claimed_again():
    slices = ClaimSlices(2)
    beat(slices, claims(20))
    changed = claims(20, {7: 10})
    assert 7 in {c[1] for c in slices.choose(changed)}  # (the packers were full: not carried)
    assert 7 in beat(slices, changed)
    assert 7 not in beat(slices, changed)


def test_a_retired_claim_is_its_own_and_claimed_at_once():
    slices = ClaimSlices(1)
    current = claims(10)
    beat(slices, current)
    retired = ("t", 3, b"\x02" * 16, 0, 4, 9, True)
    got = slices.choose(current + [retired])
    assert list(retired) in got


def test_the_turn_holds_its_place_when_partitions_before_it_go():
    slices = ClaimSlices(3)
    current = claims(12)
    beat(slices, current)
    since = {p: 0 for p in range(12)}
    for i in range(60):
        if i % 5 == 2:  # (one before the turn goes, another comes back)
            gone = sorted(since, key=lambda p: since[p])[0]
            current = [c for c in current if c[1] != gone] + \
                [("t", 12 + i, INC, 0, 9, 9, False)]
            del since[gone]
            since[12 + i] = 0
        got = {c[1] for c in slices.choose(current)}
        slices.carried_now([c for c in current if c[1] in got], i)
        for p in since:
            since[p] = 0 if p in got else since[p] + 1
        assert max(since.values()) < slices.every(), (i, since)


def test_a_slice_not_handed_on_is_the_next_one():
    slices = ClaimSlices(3)
    beat(slices, claims(9))
    first = {c[1] for c in slices.choose(claims(9))}  # (the packers were full: not carried)
    assert beat(slices, claims(9)) == first


def named(slices: ClaimSlices, current: list, now_ms: int, hand_on: bool = True) -> dict:
    """One heartbeat at `now_ms`: partition -> when its chain was first named, as it says."""
    chosen = slices.choose(current)
    times = slices.named_at(chosen, now_ms)
    if hand_on:
        slices.carried_now(chosen, now_ms)
    return {(c[1], c[6]): t for c, t in zip(chosen, times)}


def test_each_claim_says_when_its_chain_was_first_named_whichever_heartbeat_carries_it():
    """A receiver first hearing an idle partition's claim K heartbeats after it first heard
    the reader learns the chain was named long before (diode.accounting.ordering): the time
    of the first heartbeat handed on that carried it, not of the one carrying it now."""
    n, most = 20, 2
    slices = ClaimSlices(most)
    assert named(slices, claims(n), 1000) == {(p, False): 1000 for p in range(n)}
    assert named(slices, claims(n), 2000, hand_on=False) == {(0, False): 1000,
                                                             (1, False): 1000}
    said: dict = {}
    for i in range(slices.every()):
        said.update(named(slices, claims(n), 3000 + i))
    assert said == {(p, False): 1000 for p in range(n)}  # (every one in K, as first named)
    # Records sent (a changed claim) name the same chain; one started again (a rewind) is
    # named anew from the heartbeat that first carries it, one not handed on not counted.
    current = claims(n, {4: 12})
    current[5] = ("t", 5, INC, 10, 12, 12, False)
    assert named(slices, current, 5000, hand_on=False)[(5, False)] == 5000
    got = named(slices, current, 6000)
    assert got[(4, False)] == 1000 and got[(5, False)] == 6000
    # The incarnation retired: its retired claim is the same chain, named when it was.
    retired = [c for c in current if c[1] != 5] + [("t", 5, INC, 10, 12, 12, True)]
    assert named(slices, retired, 7000)[(5, True)] == 6000
    # Bounded: the times kept are those of the chains the claims speak of now.
    assert len(slices.named) == n
    named(slices, claims(3), 8000)
    assert set(slices.named) == {("t", p, INC, 0) for p in range(3)}


def test_with_no_bound_every_claim_says_when_its_chain_was_first_named_too():
    slices = ClaimSlices(0)
    assert set(named(slices, claims(3), 1000).values()) == {1000}
    current = claims(3)
    current[1] = ("t", 1, INC, 10, 12, 12, False)
    assert named(slices, current, 2000) == {(0, False): 1000, (1, False): 2000,
                                            (2, False): 1000}
    assert set(slices.named) == {("t", 0, INC, 0), ("t", 1, INC, 10), ("t", 2, INC, 0)}
