"""diode.link.replay.ReplayWindow: every datagram is accepted at most once, in any order."""

import random

import pytest

from diode.errors import RejectedDatagram
from diode.link.replay import ReplayWindow


def accepted(w, session, seqs):
    out = []
    for s in seqs:
        try:
            w.check(session, s)
            out.append(s)
        except RejectedDatagram as exc:
            assert exc.reason == "replayed"
    return out


def test_each_sequence_number_accepted_once_in_any_order_within_the_window():
    seqs = list(range(1, 5001))
    random.Random(1).shuffle(seqs)  # reordering of up to 5000 < window
    w = ReplayWindow(window=8192)
    assert sorted(accepted(w, 1, seqs + seqs[:1000])) == list(range(1, 5001))


def test_too_old_is_rejected_and_sessions_are_independent():
    w = ReplayWindow(window=64)
    w.check(1, 1000)
    with pytest.raises(RejectedDatagram):
        w.check(1, 1000 - 64)  # outside the window: cannot tell, so refused
    w.check(1, 1000 - 63)
    w.check(2, 1000)  # the same number in another session is another datagram
    with pytest.raises(RejectedDatagram):
        w.check(2, 1000)


def test_large_jump_forward_clears_the_window():
    w = ReplayWindow(window=64)
    w.check(1, 5)
    w.check(1, 10_000)
    assert accepted(w, 1, [9_999, 10_000, 9_990]) == [9_999, 9_990]


def test_memory_is_bounded_by_sessions():
    w = ReplayWindow(max_sessions=10)
    for session in range(1000):
        w.check(session, 1)
    assert len(w._sessions) == 10
    w.check(0, 1)  # forgotten session: accepted again (bounded memory beats a perfect memory)


class Model:
    """What the window promises, as a set: each number once, none older than the window."""

    def __init__(self, window):
        self.window, self.seen, self.highest = window, set(), None

    def check(self, seq) -> bool:
        if self.highest is not None and self.highest - seq >= self.window:
            return False
        if seq in self.seen:
            return False
        self.seen.add(seq)
        self.highest = seq if self.highest is None else max(self.highest, seq)
        return True


def test_the_window_accepts_exactly_what_the_model_does():
    rng = random.Random(5)
    for window in (64, 128, 1024):
        w, model = ReplayWindow(window=window), Model(window)
        seq = 1000
        for _ in range(20_000):
            step = rng.choice((1, 1, 2, 3, -5, -40, -70, 70, 300, -window, window + 9))
            seq = max(0, seq + step)
            try:
                w.check(9, seq)
                ok = True
            except RejectedDatagram:
                ok = False
            assert ok == model.check(seq), (window, seq)
