"""diode.link.pacing: the sender never bursts above the link rate (nothing tells it of drops), and
pacing it costs a few per cent of a core, not one."""

import json
import logging
import math
import struct

import pytest
from hypothesis import given, settings, strategies as st

from diode.link import pacing
from diode.link.pacing import Egress, Pacer, burst_bytes, open_pacer

LINK_400 = 400e6 / 8  # 400 Mbit/s in bytes per second


class FakeTime:
    """A clock that moves only when slept on, or by `tick` per reading. Each sleep may wake
    `late` seconds after it asked (time.sleep's overshoot); readings are counted."""

    def __init__(self, tick=1e-6, late=lambda: 0.0):
        self.now = 1000.0
        self.tick = tick
        self.late = late
        self.reads = 0
        self.sleeps = []

    def clock(self):
        self.reads += 1
        self.now += self.tick
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds + self.late()

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


@pytest.mark.parametrize("size", [1500, 65028])
def test_long_run_rate_equals_the_configured_rate(size):
    ft = FakeTime(late=lambda: 80e-6)  # every wake-up 80 µs late, as on a real host
    p = ft.pacer(LINK_400, burst_bytes(LINK_400, size))
    start = ft.clock()
    for _ in range(20000):
        p.wait(size)
    assert 20000 * size / (ft.clock() - start) == pytest.approx(LINK_400, rel=0.01)


def test_a_send_waits_for_its_slot_and_never_goes_early():
    ft = FakeTime()
    p = ft.pacer(1000)  # 1000 bytes/s, no burst
    p.wait(500)          # the first send goes at once
    assert ft.sleeps == []
    before = ft.now
    p.wait(500)          # its slot is 0.5 s away: one sleep, no spin
    assert ft.sleeps == [pytest.approx(0.5, abs=1e-5)]
    assert ft.now - before >= 0.5 - 1e-9


@pytest.mark.parametrize("size", [1500, 65028])
def test_pacing_400_mbits_never_busy_waits(size):
    """One clock reading per datagram (two when it slept), at most one sleep, and sleeps long
    enough that wake-ups cost little: at least half the burst, about 1 ms at 400 Mbit/s."""
    ft = FakeTime(late=lambda: 80e-6)
    burst = burst_bytes(LINK_400, size)
    p = ft.pacer(LINK_400, burst)
    n = int(LINK_400 * 2 / size)  # two seconds of link time
    for _ in range(n):
        reads, sleeps = ft.reads, len(ft.sleeps)
        p.wait(size)
        assert ft.reads - reads == 1 + (len(ft.sleeps) - sleeps)
        assert len(ft.sleeps) - sleeps <= 1
    assert min(ft.sleeps) >= burst / LINK_400 / 2
    assert len(ft.sleeps) <= 2 * 1000 * 2 / 1.5  # at most ~1300 wake-ups per second


def test_short_waits_sleep_too():
    ft = FakeTime()
    p = ft.pacer(10_000_000)
    p.wait(1000)
    before = ft.now
    p.wait(1000)  # 100 µs: slept (a little late is fine), never spun
    assert len(ft.sleeps) == 1 and ft.reads == 4  # the pacer's start, two waits, one wake-up
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


def test_the_burst_is_a_few_datagrams_or_a_millisecond_of_link_time():
    assert burst_bytes(LINK_400, 1500) == 50_000           # 1 ms, 33 datagrams
    assert burst_bytes(LINK_400, 65028) == 2 * 65028       # 2 datagrams, 2.6 ms
    assert burst_bytes(10e6 / 8, 1500) == 3000             # 2 datagrams, 2.4 ms


def sends(rate, burst, steps, late):
    """Send times and sizes of datagrams paced through a FakeTime whose wake-ups are late by
    the drawn amounts, with the sender's own work between datagrams."""
    lateness = iter(late * 1000)
    ft = FakeTime(tick=1e-7, late=lambda: next(lateness, 0.0))
    p = ft.pacer(rate, burst)
    out = []
    for size, work in steps:
        ft.now += work
        p.wait(size)
        out.append((ft.clock(), size))
    return out


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([1e5, 1.25e6, 5e7]),
       burst=st.sampled_from([0, 1472, 3 * 8972, 50_000]),
       steps=st.lists(st.tuples(st.integers(28, 65507),
                                st.one_of(st.just(0.0), st.floats(0, 0.05))),
                      min_size=2, max_size=60),
       late=st.lists(st.sampled_from([0.0, 60e-6, 300e-6, 0.02]), min_size=1, max_size=5))
def test_no_window_ever_exceeds_rate_plus_burst(rate, burst, steps, late):
    """Whatever the sender does between sends and however late sleeps wake, bytes sent in any
    window [t_i, t_j] are at most rate * (t_j - t_i) + burst_bytes + the last datagram."""
    sent = sends(rate, burst, steps, late)
    for i in range(len(sent)):
        total = 0
        for j in range(i, len(sent)):
            total += sent[j][1]
            window = sent[j][0] - sent[i][0]
            assert total <= rate * window + burst + sent[j][1] + 1e-6 * rate


# -- kernel fq pacing: detection and choice -----------------------------------------------------

def tc(*qdiscs):
    return json.dumps(list(qdiscs))


NOQUEUE = {"kind": "noqueue", "handle": "0:", "root": True, "refcnt": 2, "options": {}}
FQ_ROOT = {"kind": "fq", "handle": "8001:", "root": True, "refcnt": 2,
           "options": {"limit": 10000, "flow_limit": 100, "buckets": 1024, "quantum": 3028}}


def fq_leaf(n, flow_limit=100, **options):
    return {"kind": "fq", "handle": "0:", "parent": f":{n}",
            "options": {"flow_limit": flow_limit, **options}}


@pytest.mark.parametrize("qdiscs, expected", [
    ([NOQUEUE], ("noqueue", 0)),
    ([{"kind": "pfifo_fast", "handle": "0:", "root": True, "options": {"bands": 3}}],
     ("pfifo_fast", 0)),
    ([FQ_ROOT], ("fq", 100)),
    ([FQ_ROOT, {"kind": "clsact", "handle": "ffff:", "parent": "ffff:fff1", "options": {}}],
     ("fq", 100)),
    ([{"kind": "mq", "handle": "0:", "root": True}, fq_leaf(1), fq_leaf(2, flow_limit=200)],
     ("mq/fq", 100)),
    ([{"kind": "mq", "handle": "0:", "root": True}, fq_leaf(1),
      {"kind": "pfifo_fast", "handle": "0:", "parent": ":2", "options": {}}], ("mq", 0)),
    ([{**FQ_ROOT, "options": {"flow_limit": 100, "pacing": False}}], ("fq nopacing", 0)),
    ([{"kind": "fq_codel", "handle": "0:", "root": True, "options": {}}], ("fq_codel", 0)),
])
def test_fq_paces_only_as_root_or_on_every_queue(qdiscs, expected):
    assert pacing.fq_of(qdiscs) == expected


def test_probe_asks_ip_and_tc_about_the_device_the_route_leaves_by():
    calls = []

    def run(argv):
        calls.append(argv)
        return {"route": json.dumps([{"dst": "192.0.2.7", "gateway": "192.0.2.1",
                                      "dev": "eth0"}]),
                "link": json.dumps([{"ifname": "eth0", "mtu": 9000}]),
                "qdisc": tc(FQ_ROOT)}[argv[2]]

    assert pacing.probe_egress("192.0.2.7", run=run) == Egress("eth0", "fq", 100, 9000)
    assert calls == [["ip", "-j", "route", "get", "192.0.2.7"],
                     ["ip", "-j", "link", "show", "dev", "eth0"],
                     ["tc", "-j", "qdisc", "show", "dev", "eth0"]]


class FakeSocket:
    family = 2  # AF_INET

    def __init__(self, error=None):
        self.error = error
        self.options = []

    def setsockopt(self, level, name, value):
        if self.error:
            raise self.error
        self.options.append((level, name, value))


def choose(caplog, egress, sock=None, rate=LINK_400, size=1500):
    def probe(host, family):
        if isinstance(egress, Exception):
            raise egress
        return egress

    sock = sock or FakeSocket()
    with caplog.at_level(logging.INFO, logger="diode.udp_sender-0"):
        p = open_pacer(sock, "192.0.2.7", rate, size, logging.getLogger("diode.udp_sender-0"),
                       probe=probe)
    return p, sock, [r.getMessage() for r in caplog.records]


def test_fq_and_a_socket_that_takes_the_rate_choose_kernel_pacing(caplog):
    p, sock, lines = choose(caplog, Egress("eth0", "fq", 100, 1500))
    assert p.kernel
    [(level, name, value)] = sock.options
    assert (level, name) == (1, 47)  # SOL_SOCKET, SO_MAX_PACING_RATE
    assert LINK_400 < struct.unpack("=Q", value)[0] <= LINK_400 * 1.1  # fq drains the guard
    assert p.rate == LINK_400 and p.burst_bytes == burst_bytes(LINK_400, 1500)
    assert len(lines) == 1 and lines[0].startswith("kernel fq pacing at 400 Mbit/s on eth0")


@pytest.mark.parametrize("egress, why", [
    (Egress("lo", "noqueue"), "lo has qdisc noqueue, not fq"),
    (Egress("eth0", "mq"), "eth0 has qdisc mq, not fq"),
    (FileNotFoundError(2, "No such file or directory", "tc"), "cannot tell the qdisc"),
])
def test_without_fq_the_sleeping_pacer_alone_and_the_socket_untouched(caplog, egress, why):
    p, sock, lines = choose(caplog, egress)
    assert not p.kernel and sock.options == []
    assert p.burst_bytes == burst_bytes(LINK_400, 1500)
    assert len(lines) == 1 and lines[0].startswith("sleeping pacer at 400 Mbit/s") \
        and why in lines[0]


def test_a_socket_refusing_the_pacing_rate_falls_back_with_one_line(caplog):
    p, _, lines = choose(caplog, Egress("eth0", "fq", 100, 1500),
                         sock=FakeSocket(PermissionError(1, "Operation not permitted")))
    assert not p.kernel and p.burst_bytes == burst_bytes(LINK_400, 1500)
    assert len(lines) == 1 and "sleeping pacer" in lines[0] \
        and "refused SO_MAX_PACING_RATE" in lines[0]


def test_unpaced_asks_nothing(caplog):
    p, sock, lines = choose(caplog, AssertionError("not probed"), rate=0)
    assert not p.kernel and p.rate == 0 and sock.options == []
    assert lines == ["unpaced: link.rate.mbps is 0"]


def test_fq_that_cannot_hold_one_datagram_is_not_used(caplog):
    # 65 028 bytes leave as 45 fragments on an MTU of 1500; a flow_limit of 40 drops the rest
    p, sock, lines = choose(caplog, Egress("eth0", "fq", 40, 1500), size=65028)
    assert not p.kernel and sock.options == []
    assert len(lines) == 1 and "flow_limit" in lines[0]


@pytest.mark.parametrize("flow_limit, mtu, size", [
    (100, 1500, 1500), (100, 1500, 65028), (100, 65536, 65028), (100, 9000, 8972),
    (50, 1500, 9000), (1000, 1500, 1500)])
def test_fq_never_drops_what_the_guard_lets_through(caplog, flow_limit, mtu, size):
    """fq drops (silently, for UDP) a flow's packets beyond flow_limit. Model its queue as
    draining at the rate the socket was given, with the headers fq counts and the pacer does
    not (link layer, IPv6, one set per fragment): the guard's bursts, late wake-ups and all,
    never fill it."""
    p, sock, _ = choose(caplog, Egress("eth0", "fq", flow_limit, mtu), size=size)
    assert p.kernel
    fq_rate = struct.unpack("=Q", sock.options[0][2])[0]
    packets = 1 if size <= mtu else math.ceil((size - 20) / ((mtu - 48) // 8 * 8))
    counted = size + 20 + packets * (18 + 48 * (packets > 1))  # what fq counts per datagram
    lateness = iter([0.0, 0.02, 0.0, 300e-6, 60e-6] * 400)
    ft = FakeTime(tick=1e-7, late=lambda: next(lateness, 0.0))
    guard = Pacer(LINK_400, p.burst_bytes, clock=ft.clock, sleep=ft.sleep)
    queued, last = 0.0, ft.now  # bytes fq holds, as it counts them
    for _ in range(int(LINK_400 * 0.5 / size)):
        guard.wait(size)
        queued = max(0.0, queued - (ft.now - last) * fq_rate) + counted
        last = ft.now
        assert queued / counted * packets <= flow_limit
