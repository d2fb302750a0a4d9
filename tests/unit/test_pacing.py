"""diode.pacing.Pacer: the sender never bursts above the link rate; nothing tells it of drops."""

import pytest
from hypothesis import given, settings, strategies as st

from diode.pacing import SPIN_SECONDS, Pacer


class FakeTime:
    """A clock that moves only when slept on, or by `tick` per reading (so spins end)."""

    def __init__(self, tick=1e-6):
        self.now = 1000.0
        self.tick = tick
        self.sleeps = []

    def clock(self):
        self.now += self.tick
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def pacer(self, rate, burst=0):
        return Pacer(rate, burst, clock=self.clock, sleep=self.sleep)


def test_rate_zero_never_waits():
    ft = FakeTime(tick=0)
    p = ft.pacer(0)
    assert all(p.delay(65507) == 0 for _ in range(1000))
    for _ in range(100):
        p.wait(65507)
    assert ft.sleeps == [] and ft.now == 1000.0


def test_back_to_back_delays_follow_the_rate():
    ft = FakeTime(tick=0)
    p = ft.pacer(1_000_000)  # 1 MB/s: 1000 bytes every millisecond
    delays = [p.delay(1000) for _ in range(5)]
    assert delays == pytest.approx([0.0, 0.001, 0.002, 0.003, 0.004])


def test_long_run_rate_equals_the_configured_rate():
    ft = FakeTime()
    rate = 12.5e6  # 100 Mbit/s
    p = ft.pacer(rate, burst=2 * 1472)
    start = ft.clock()
    sent = 0
    for _ in range(20000):
        p.wait(1472)
        sent += 1472
    elapsed = ft.clock() - start
    assert sent / elapsed == pytest.approx(rate, rel=0.01)


def test_wait_sleeps_then_spins_to_the_deadline():
    ft = FakeTime()
    p = ft.pacer(1000)  # 1000 bytes/s
    p.wait(500)          # the first send goes at once
    assert ft.sleeps == []
    before = ft.now
    p.wait(500)          # must wait ~0.5 s
    assert ft.sleeps == [pytest.approx(0.5 - SPIN_SECONDS, abs=1e-5)]
    assert ft.now - before == pytest.approx(0.5, abs=1e-5)
    assert ft.now - before >= 0.5 - 1e-9  # never early


def test_short_waits_only_spin():
    ft = FakeTime()
    p = ft.pacer(10_000_000)
    p.wait(1000)
    before = ft.now
    p.wait(1000)  # 100 µs: less than the spin threshold, time.sleep would overshoot
    assert ft.sleeps == []
    assert ft.now - before >= 1000 / 10_000_000 - 1e-9


def test_idle_time_earns_at_most_burst_bytes_of_credit():
    ft = FakeTime(tick=0)
    rate, burst, size = 1_000_000, 10_000, 1000
    p = ft.pacer(rate, burst)
    ft.sleep(3600)  # idle for an hour
    delays = [p.delay(size) for _ in range(30)]
    free = sum(size for d in delays if d < 1e-9)
    # the idle credit covers burst_bytes beyond the packet being sent, never more
    assert free == burst + size
    assert delays[11:] == pytest.approx([(k - 10) * size / rate for k in range(11, 30)])


def test_without_burst_idle_time_buys_no_burst():
    ft = FakeTime(tick=0)
    p = ft.pacer(1_000_000)
    ft.sleep(10)
    assert p.delay(1000) == 0
    assert p.delay(1000) == pytest.approx(0.001)


def test_credit_is_not_banked_before_the_first_send():
    ft = FakeTime(tick=0)
    p = ft.pacer(1_000_000, burst=5000)
    assert p.delay(1000) == 0
    assert p.delay(1000) == pytest.approx(0.001)  # a new pacer starts without credit


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([1e5, 1.25e6, 5e7]),
       burst=st.sampled_from([0, 1472, 3 * 8972]),
       steps=st.lists(st.tuples(st.integers(28, 65507),
                                st.one_of(st.just(0.0), st.floats(0, 0.05))),
                      min_size=2, max_size=60))
def test_no_window_ever_exceeds_rate_plus_burst(rate, burst, steps):
    """Whatever the sender does between sends, bytes sent in any window [t_i, t_j] are at
    most rate * (t_j - t_i) + burst_bytes + the last datagram."""
    ft = FakeTime(tick=1e-7)
    p = ft.pacer(rate, burst)
    sends = []
    for size, work in steps:
        ft.sleep(work)       # the sender's own work between datagrams
        p.wait(size)
        sends.append((ft.clock(), size))
    for i in range(len(sends)):
        total = 0
        for j in range(i, len(sends)):
            total += sends[j][1]
            window = sends[j][0] - sends[i][0]
            assert total <= rate * window + burst + sends[j][1] + 1e-6 * rate
