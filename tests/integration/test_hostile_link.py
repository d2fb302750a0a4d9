"""A hostile link, simulated by diode.link.linksim between the sender and the receiver."""

import json
import random
import socket
import subprocess
import sys
import time

from diode.link import crypto, runs, wire
from diode.link.linksim import Faults, FaultSettings
from diode.runtime import topology
from diode.runtime.supervisor import load_secrets
from tests.conftest import (consume, create_topic, headers_of, only_on, produce,
                            source_coordinates, topic_id, wait_for)

def missing_offsets(dst, expected_events=0, timeout=5.0):
    """(topic, partition, offset) reported missing and not filled later, from the topic."""
    events = [json.loads(m.value()) for m in consume(dst, "missing", expected_events,
                                                     timeout=timeout, idle=1.0)]
    missing = set()
    for e in events:
        offsets = {(e["sourceTopic"], e["sourcePartition"], o)
                   for o in range(e["firstOffset"], e["lastOffset"] + 1)}
        if e["type"] == "missing":
            missing |= offsets
        elif e["type"] == "filled":
            missing -= offsets
    return missing, events


def settle(lk, sent, timeout=60.0, topics=("src",)):
    """Wait until every sent record (of `topics`) has either arrived or been reported missing.
    Returns (arrived, reported missing, missing-topic events)."""
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(2)  # (polled: each look reads both topics from their start)
        arrived = {c for t in topics for c in source_coordinates(
            consume(lk.dst.bootstrap, "dst_" + t, 1, timeout=5, idle=0.5))}
        reported, events = missing_offsets(lk.dst.bootstrap, timeout=3)
        if arrived | reported >= sent or time.monotonic() > deadline:
            return arrived, reported, events


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_missing_ranges_are_exactly_the_records_lost_on_the_link(link):
    """5 % uniform loss, no FEC: what is reported missing is exactly what is absent, tail
    included, once a heartbeat interval (plus the reorder wait) has passed."""
    lk = link(Faults(FaultSettings(loss=0.05, seed=11)),
              link={"datagram.size.bytes": 600})
    create_topic(lk.src.bootstrap, "src", 3)
    total = 3000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i + b"." * 40, "partition": i % 3}
                                      for i in range(total)])
    sent = {("src", p, o) for p in range(3) for o in range(total // 3)}
    arrived, reported, events = settle(lk, sent)
    dropped = lk.sim.faults.counts.dropped
    assert dropped > 0, "the simulator dropped nothing: the test proves nothing"
    absent = sent - arrived
    assert absent, "no record was lost"
    assert reported == absent  # no false positive, no false negative
    ranges = len([e for e in events if e["type"] == "missing"])  # (metrics: about once a second)
    wait_for(lambda: lk.receiver.metric("missing_ranges", "kafka_writer") == ranges, 10,
             f"diode_missing_ranges_total to count the {ranges} reported")


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_reordering_and_duplication_keep_source_order_without_duplicates(link):
    lk = link(Faults(FaultSettings(reorder=0.02, reorder_delay_ms=20, duplicate=0.01,
                                   seed=5)),
              link={"datagram.size.bytes": 600})
    create_topic(lk.src.bootstrap, "src", 2)
    total = 4000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i, "partition": i % 2}
                                      for i in range(total)])
    got = consume(lk.dst.bootstrap, "dst_src", total, timeout=60, idle=2)
    counts = lk.sim.faults.counts
    assert counts.reordered > 0 and counts.duplicated > 0
    assert len(got) == total  # every record once
    for p in range(2):
        offsets = [int(headers_of(m)["sourceOffset"]) for m in got if m.partition() == p]
        assert offsets == list(range(total // 2))  # in source order
    # duplicated datagrams are stopped by the replay window, before any record is decoded
    # (a copy of a datagram whose records are all written may be counted a moment later: the
    # metrics files are written about once a second)
    deadline = time.monotonic() + 5
    while lk.receiver.metric("rejects", "unpacker", reason="replayed") < counts.duplicated \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lk.receiver.metric("rejects", "unpacker", reason="replayed") == counts.duplicated
    assert lk.receiver.metric("missing_ranges", "kafka_writer") == 0


class Capture(Faults):
    """No faults; keeps a copy of every datagram that crossed."""

    def __init__(self):
        super().__init__(FaultSettings())
        self.datagrams = []

    def decide(self, datagram):
        self.datagrams.append(datagram)
        return super().decide(datagram)


def test_captured_datagrams_replayed_truncated_or_flipped_write_nothing(link):
    cap = Capture()
    lk = link(cap, receiver={"heartbeat.topic": "heartbeats"})
    create_topic(lk.src.bootstrap, "src", 1)
    produce(lk.src.bootstrap, "src", [{"value": b"real %d" % i} for i in range(500)])
    assert len(consume(lk.dst.bootstrap, "dst_src", 500, timeout=30)) == 500
    # A heartbeat after the records: link liveness, with what the sender has sent, and where
    # its chain started (diode verify reads a lost head and tail from these), of which
    # incarnation, and where the source ended
    sent = {"topic": "src", "partition": 0, "offset": 499, "chainStart": 0,
            "topicId": topic_id(lk.src.bootstrap, "src"), "sourceEnd": 499, "retired": False}
    beats = []

    def beat_after_the_records():
        beats[:] = [json.loads(m.value()) for m in consume(lk.dst.bootstrap, "heartbeats", 2,
                                                           timeout=10, idle=1)]
        return any(b["partitions"] == 1 and b["counters"]["records"] >= 500 and b["session"]
                   and sent in b["lastSent"] for b in beats)
    wait_for(beat_after_the_records, 30, f"a heartbeat with {sent}")
    assert all(b["sourceCluster"] for b in beats if b["lastSent"])
    assert lk.sender.stop() == 0  # nothing more crosses: what was captured is all there is
    wait_for(lambda: lk.receiver.metric("datagrams", "udp_reader") >= len(cap.datagrams) and
             lk.receiver.metric("records", "kafka_writer") >= 500, 30,
             "the receiver to count every datagram the link carried and the records written")
    captured = list(cap.datagrams)
    written = lk.receiver.metric("records", "kafka_writer")
    pids = {n: p.pid for n, p in lk.receiver.workers().items()}
    rejected_before = lk.receiver.metric("rejects", "unpacker")
    rng = random.Random(3)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hostile = []
    for dg in captured:
        flipped = bytearray(dg)
        flipped[rng.randrange(len(dg))] ^= 1 << rng.randrange(8)
        hostile += [dg, dg[:rng.randrange(len(dg))], bytes(flipped)]
    for i, dg in enumerate(hostile):
        s.sendto(dg, ("127.0.0.1", lk.receiver_port))
        if i % 100 == 0:
            time.sleep(0.01)  # (pacing: the socket's buffer is not what is tested)
    wait_for(lambda: lk.receiver.metric("datagrams", "udp_reader") >=
             len(cap.datagrams) + len(hostile) and
             lk.receiver.metric("rejects", "unpacker", reason="replayed") >= len(captured),
             30, "every datagram counted and the replayed ones rejected")
    # (cap.datagrams: with any the link still carried after the sender stopped)
    assert lk.receiver.metric("datagrams", "udp_reader") == len(cap.datagrams) + len(hostile)
    assert lk.receiver.metric("records", "kafka_writer") == written  # nothing more written
    assert len(consume(lk.dst.bootstrap, "dst_src", 500, timeout=5, idle=1)) == 500
    assert lk.receiver.metric("rejects", "unpacker", reason="replayed") >= len(captured)
    assert lk.receiver.metric("rejects", "unpacker") > rejected_before
    assert {n: p.pid for n, p in lk.receiver.workers().items()} == pids  # no worker died
    # the sender stopped cleanly and said so: the receiver does not take it for a silent link
    # (the replayed heartbeats, rejected, did not say otherwise)
    assert "the sender stopped (clean stop)" in lk.receiver.output()
    quiet_for(lk, 2.0)  # (the heartbeat interval is 0.3 s)
    assert "no heartbeat from the sender" not in lk.receiver.output()
    assert lk.receiver.metric("link_silent", "kafka_writer") == 0
    assert lk.receiver.metric("sender_stopped", "kafka_writer") == 1


def quiet_for(lk, seconds: float) -> None:
    """Until the receiver has heard no heartbeat for `seconds` (on its clock)."""
    wait_for(lambda: lk.receiver.metric("link_heartbeat_age_seconds", "kafka_writer") >= seconds,
             seconds + 10, f"{seconds} s without a heartbeat")


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_a_cut_link_is_reported_silent_and_a_clean_stop_is_reported_as_one(link):
    """The link cut (every datagram dropped): the receiver warns that the link, the sender or
    its source is down. Mended, then the sender stopped (SIGTERM): the receiver logs that the
    sender stopped cleanly, and no warning more however long it stays stopped."""
    lk = link(Faults(FaultSettings()))
    create_topic(lk.src.bootstrap, "src", 1)
    produce(lk.src.bootstrap, "src", [{"value": b"r %d" % i} for i in range(100)])
    assert len(consume(lk.dst.bootstrap, "dst_src", 100, timeout=30)) == 100
    warning = "no heartbeat from the sender"
    lk.sim.faults.s = FaultSettings(loss=1.0)  # the cut
    wait_for(lambda: warning in lk.receiver.output(), 15, "the silent link's warning")
    assert lk.receiver.metric("sender_stopped", "kafka_writer") == 0
    lk.sim.faults.s = FaultSettings()
    wait_for(lambda: "heartbeats again" in lk.receiver.output(), 15, "heartbeats again")
    assert lk.sender.stop() == 0
    wait_for(lambda: "the sender stopped (clean stop)" in lk.receiver.output(), 15,
             "the clean stop logged")
    quiet_for(lk, 3.0)
    out = lk.receiver.output()
    assert out.count(warning) == 1, out[-3000:]
    assert out.count("the sender stopped (clean stop)") == 1, out[-3000:]
    assert lk.receiver.metric("link_silent", "kafka_writer") == 0


def delivered(lk, total, partitions, timeout=60):
    """Distinct records arrived once the stream has settled."""
    got = consume(lk.dst.bootstrap, "dst_src", total, timeout=timeout, idle=2,
                  distinct=lambda m: m.value())
    return {m.value() for m in got}


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_fec_8_plus_2_delivers_at_least_999_per_mille_at_1_percent_loss(link):
    lk = link(Faults(FaultSettings(loss=0.01, seed=21)),
              link={"datagram.size.bytes": 600, "fec.data.datagrams": 8,
                    "fec.parity.datagrams": 2})
    create_topic(lk.src.bootstrap, "src", 2)
    total = 6000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i, "partition": i % 2}
                                      for i in range(total)])
    got = delivered(lk, total, 2, timeout=30)
    assert lk.sim.faults.counts.dropped > 0
    assert lk.receiver.metric("fec_recovered", "unpacker") > 0
    assert len(got) >= 0.999 * total


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_bursts_of_five_lost_datagrams_are_recovered_through_interleaving(link):
    lk = link(Faults(FaultSettings(burst_probability=0.01, burst_length=5, seed=8)),
              link={"datagram.size.bytes": 600, "fec.data.datagrams": 8,
                    "fec.parity.datagrams": 2, "fec.interleave.depth": 4})
    create_topic(lk.src.bootstrap, "src", 2)
    total = 6000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i, "partition": i % 2}
                                      for i in range(total)])
    got = delivered(lk, total, 2, timeout=30)
    assert lk.sim.faults.counts.burst_dropped >= 5
    assert len(got) == total
    assert lk.receiver.metric("missing_ranges", "kafka_writer") == 0


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_redundant_copies_recover_uniform_loss_and_are_deduplicated(link):
    lk = link(Faults(FaultSettings(loss=0.05, seed=4)),
              link={"datagram.size.bytes": 600, "copies": 2})
    create_topic(lk.src.bootstrap, "src", 1)
    total = 3000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i} for i in range(total)])
    sent = {("src", 0, o) for o in range(total)}
    # (settled: every record arrived or reported, not a consumer waiting out its timeout for
    # records both copies of which were lost)
    arrived, reported, _ = settle(lk, sent)
    got = consume(lk.dst.bootstrap, "dst_src", len(arrived), timeout=10, idle=1)
    assert len(got) == len({m.value() for m in got}) == len(arrived)  # no duplicate written
    # 5 % of datagrams are lost; both copies of one only 0.25 % of the time (a lost datagram
    # carries ~40 records here, so allow a couple): far better than without copies
    assert len(arrived) >= (1 - 0.05 / 2) * total
    assert reported == sent - arrived  # what both copies of lost is reported, exactly
    assert lk.receiver.metric("rejects", "unpacker", reason="replayed") > 0


def diode(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diode", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_lost_records_open_tickets_that_a_signed_resend_closes(link, tmp_path):
    """5 % loss opens a ticket per missing range; `diode tickets --manifest` on the low side
    writes them signed; a copy with one range widened, or one byte changed, is refused by
    `diode resend` on the high side; the manifest itself sends exactly those ranges again, each
    resent record names its ticket, and every ticket closes, filled."""
    lk = link(Faults(FaultSettings(loss=0.05, seed=11)), link={"datagram.size.bytes": 600})
    create_topic(lk.src.bootstrap, "src", 2)
    total = 2000
    produce(lk.src.bootstrap, "src", [{"value": b"%05d" % i, "partition": i % 2}
                                      for i in range(total)])
    sent = {("src", p, o) for p in range(2) for o in range(total // 2)}
    arrived, reported, events = settle(lk, sent)
    assert reported and reported == sent - arrived
    r = diode("tickets", lk.receiver_topo, "--open", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    opened = json.loads(r.stdout)
    assert {("src", t["partition"], o) for t in opened
            for o in range(t["first"], t["last"] + 1)} == reported
    assert {t["ticket"] for t in opened} == {e["ticket"] for e in events
                                             if e["type"] == "missing"}
    path = tmp_path / "manifest.json"
    r = diode("tickets", lk.receiver_topo, "--manifest", path)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads(path.read_text())
    assert manifest["auth"]["alg"] == "HMAC-SHA256"

    widened = json.loads(path.read_text())
    widened["missing"][0]["ranges"][0][1] += 5
    changed = path.read_text().replace('"ranges"', '"rangez"', 1)
    for i, bad in enumerate((json.dumps(widened), changed)):
        (tmp_path / f"bad{i}.json").write_text(bad)
        r = diode("resend", tmp_path / f"bad{i}.json", "--topology", lk.sender_topo)
        assert r.returncode == 1 and "is refused, nothing resent" in r.stderr, r.stderr[-2000:]
        assert "resend complete" not in r.stderr

    lk.sim.faults = Faults(FaultSettings())  # the operator resends over a good day's link
    r = diode("resend", path, "--topology", lk.sender_topo)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resend complete" in r.stderr
    got = consume(lk.dst.bootstrap, "dst_src", total, timeout=30, idle=1,
                  distinct=lambda m: headers_of(m)["sourceOffset"] + headers_of(m)[
                      "sourcePartition"])
    assert set(source_coordinates(got)) == sent
    ticket_of = {("src", t["partition"], o): t["ticket"] for t in opened
                 for o in range(t["first"], t["last"] + 1)}
    resent = [m for m in got if "diodeTicket" in headers_of(m)]
    named = {(c, headers_of(m)["diodeTicket"].decode())
             for c, m in zip(source_coordinates(resent), resent)}
    assert named == {(c, ticket_of[c]) for c in reported}
    book = wait_for(lambda: (lambda b: b if all(t["state"] == "filled" for t in b) else None)(
        json.loads(diode("tickets", lk.receiver_topo, "--json").stdout)), 30,
        "every ticket closed")
    assert sorted(t["ticket"] for t in book) == sorted(t["ticket"] for t in opened)
    assert {t["state"] for t in book} == {"filled"}
    assert all(t["closedAt"] >= t["openedAt"] for t in book)
    still_missing, events = missing_offsets(lk.dst.bootstrap, timeout=3)
    assert still_missing == set()  # every reported range was filled
    wait_for(lambda: lk.receiver.metric("tickets_closed", "kafka_writer", reason="filled")
             == len(opened), 10, "the closed tickets counted")
    assert lk.receiver.metric("tickets_open", "kafka_writer") == 0

class LoseChainHeads(Faults):
    """Loses, on purpose, the datagram that carries the first run of a chain (the run naming no
    predecessor) of each of `heads` ((topic, partition)), once each, and holds every heartbeat
    back `beat_delay` seconds, longer than the receiver's reorder wait: the run after a lost
    head waits and is written before any heartbeat names where its chain started, the order in
    which issue 34's run lost a head silently. It opens datagrams with the link's key once
    `keyring` is set."""

    def __init__(self, heads, beat_delay: float):
        super().__init__(FaultSettings())
        self.heads, self.beat_delay = set(heads), beat_delay
        self.keyring = None
        self.lost = set()  # (topic, partition, offset) of every record in a datagram lost

    def decide(self, datagram):
        if self.keyring is None:
            return super().decide(datagram)
        h, payload = wire.unseal(datagram, self.keyring)
        if h.kind == wire.KIND_HEARTBEAT:
            return [(delay + self.beat_delay, dg) for delay, dg in super().decide(datagram)]
        carried = [runs.Run.decode(bytes(part[3])) for part in runs.split_payload(payload)] \
            if h.kind == wire.KIND_DATA else []
        heads = {(r.topic, r.partition) for r in carried if r.prev == -1} & self.heads
        if not heads:
            return super().decide(datagram)
        self.heads -= heads
        self.lost |= {(r.topic, r.partition, o) for r in carried for o in r.offsets}
        self.counts.received += 1
        self.counts.dropped += 1
        return []


@only_on("tansu")  # (the broker does not matter here)
def test_a_lost_first_datagram_of_a_partition_and_of_every_partition_is_reported(link):
    """Issue 34: both sides running, the first datagram of a partition lost (its chain's first
    records, the head), and then of every partition of a new topic; the heartbeats naming where
    the chains started come after the runs that follow the heads were written. Exactly the
    records of the lost datagrams are reported missing (topic, partition, offsets; "gap", or
    "tail" for the last records of a partition that rode with a head), and nothing else.
    Before, the heads went unreported: the writer took each chain for one it had joined."""
    faults = LoseChainHeads({("src", 0), ("more", 0), ("more", 1), ("more", 2)},
                            beat_delay=1.0)
    lk = link(faults, link={"datagram.size.bytes": 1472},
              sender={"topics": ["src", "more"]})
    secrets = load_secrets(topology.load(lk.sender_topo))
    faults.keyring = crypto.Keyring(secrets.cipher_id, secrets.master_key)
    value = b"." * 40
    # One partition: 1 and 2 cross first, then partition 0's chain starts and its first
    # datagram is lost.
    create_topic(lk.src.bootstrap, "src", 3)
    produce(lk.src.bootstrap, "src", [{"value": value, "partition": 1 + i % 2}
                                      for i in range(200)])
    wait_for(lambda: len(consume(lk.dst.bootstrap, "dst_src", 200, timeout=5)) == 200, 30,
             "partitions 1 and 2 across")
    produce(lk.src.bootstrap, "src", [{"value": value, "partition": 0} for _ in range(300)])
    sent = {("src", p, o) for p, n in ((0, 300), (1, 100), (2, 100)) for o in range(n)}
    arrived, reported, events = settle(lk, sent)
    head = {c for c in faults.lost if c[0] == "src"}
    assert ("src", 0) not in faults.heads and {c[:2] for c in head} == {("src", 0)}
    assert head == {("src", 0, o) for o in range(len(head))}  # the chain's first records
    assert reported == head, events
    assert arrived == sent - head
    # Every partition: a new topic, a chain starts in each of its three.
    create_topic(lk.src.bootstrap, "more", 3)
    produce(lk.src.bootstrap, "more", [{"value": value, "partition": i % 3}
                                       for i in range(900)])
    sent |= {("more", p, o) for p in range(3) for o in range(300)}
    arrived, reported, events = settle(lk, sent, topics=("src", "more"))
    assert not faults.heads, "a chain's first datagram was never seen"
    heads = {c for c in faults.lost if c[0] == "more"}
    assert {c[:2] for c in heads} == {("more", p) for p in range(3)}
    assert {("more", p, 0) for p in range(3)} <= heads
    assert reported == faults.lost, events
    assert arrived == sent - faults.lost
    # (a datagram with a head may carry the last records of another partition: a tail)
    assert {e["type"] for e in events} == {"missing"}
    assert all(e["reason"] == ("gap" if any(c[:2] == (e["sourceTopic"], e["sourcePartition"])
                                            and c[2] > e["lastOffset"] for c in arrived)
                               else "tail") for e in events), events
    # (the metrics file is written about once a second: the count of what was just reported)
    wait_for(lambda: lk.receiver.metric("missing_records", "kafka_writer") == len(faults.lost),
             10, f"diode_missing_records_total to count the {len(faults.lost)} reported")
