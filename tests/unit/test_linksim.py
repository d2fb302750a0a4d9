"""diode.link.linksim: the faults the link simulator injects are the ones asked for,
reproducibly."""

import json
import socket
import threading

from diode.link.linksim import Faults, FaultSettings, LinkSim


def run(settings, n=20000):
    f = Faults(settings)
    out = [f.decide(b"datagram %d" % i) for i in range(n)]
    return f, out


def test_same_seed_same_faults_other_seed_other_faults():
    s = FaultSettings(loss=0.05, reorder=0.02, duplicate=0.01, corrupt=0.01, seed=7)
    assert run(s)[1] == run(s)[1]
    assert run(s)[1] != run(FaultSettings(loss=0.05, seed=8))[1]


def test_uniform_loss_rate_and_exact_drop_list():
    f, out = run(FaultSettings(loss=0.05, seed=3))
    dropped = [i for i, copies in enumerate(out) if not copies]
    assert f.counts.dropped_indexes == dropped
    assert 0.04 < len(dropped) / 20000 < 0.06


def test_bursts_drop_consecutive_datagrams():
    f, out = run(FaultSettings(burst_probability=0.01, burst_length=5, seed=4))
    dropped = [i for i, copies in enumerate(out) if not copies]
    runs, start = [], None
    for a, b in zip(dropped, dropped[1:] + [None]):
        start = a if start is None else start
        if b != a + 1:
            runs.append(a - start + 1)
            start = None
    assert runs and all(r % 5 == 0 for r in runs)  # back-to-back bursts merge
    assert f.counts.burst_dropped == len(dropped)


def test_duplication_reordering_and_corruption():
    f, out = run(FaultSettings(duplicate=0.02, reorder=0.03, reorder_delay_ms=7,
                               corrupt=0.01, seed=5))
    doubles = sum(1 for copies in out if len(copies) == 2)
    held = sum(1 for copies in out if copies[0][0] == 0.007)
    changed = sum(1 for i, copies in enumerate(out) if copies[0][1] != b"datagram %d" % i)
    assert doubles == f.counts.duplicated and 250 < doubles < 550
    assert held == f.counts.reordered and 450 < held < 750
    assert changed == f.counts.corrupted and 120 < changed < 300
    for i, copies in enumerate(out):  # a corrupted datagram differs by exactly one bit
        a, b = copies[0][1], b"datagram %d" % i
        assert sum(bin(x ^ y).count("1") for x, y in zip(a, b)) in (0, 1)


def test_relay_forwards_over_udp_and_reports():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5)
    sim = LinkSim(("127.0.0.1", 0), rx.getsockname(), Faults(FaultSettings(loss=0.5, seed=2)))
    stop = threading.Event()
    t = threading.Thread(target=sim.run, args=(stop.is_set,))
    t.start()
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(200):
        tx.sendto(b"%d" % i, ("127.0.0.1", sim.port))
    got = []
    try:
        counts = sim.faults.counts
        while counts.received < 200 or len(got) < counts.forwarded:
            got.append(int(rx.recv(100)))
    finally:
        stop.set()
        t.join()
        report = sim.report()
        sim.close()
    assert report["counts"]["received"] == 200
    assert sorted(got) == sorted(set(range(200)) - set(report["counts"]["dropped_indexes"]))


def test_control_socket_takes_the_link_down_and_back_and_refuses_unknown_settings():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))
    control = ctl.getsockname()
    ctl.close()
    sim = LinkSim(("127.0.0.1", 0), rx.getsockname(), Faults(FaultSettings(seed=2)),
                  control=control)
    stop = threading.Event()
    t = threading.Thread(target=sim.run, args=(stop.is_set,))
    t.start()
    me = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    me.settimeout(5)

    def ask(text: bytes) -> dict:
        me.sendto(text, control)
        return json.loads(me.recv(65536))

    def relayed(n: int) -> int:
        for i in range(n):
            me.sendto(b"%d" % i, ("127.0.0.1", sim.port))
        got = 0
        try:
            while got < n:
                rx.recv(100)
                got += 1
        except socket.timeout:
            pass
        return got

    try:
        assert relayed(20) == 20
        assert ask(b'{"loss": 1.0}')["settings"]["loss"] == 1.0
        assert relayed(20) == 0                      # the link is down
        assert "unknown settings" in ask(b'{"los": 1}')["error"]
        assert ask(b"not json").get("error")
        assert sim.faults.s.loss == 1.0              # a refused change changes nothing
        assert ask(b"{}")["settings"]["loss"] == 0.0  # back to the starting settings
        assert relayed(20) == 20
    finally:
        stop.set()
        t.join()
        sim.close()
