"""A durable receiver (docs/design.md §5): restarts and outages lose nothing silently.

The sender and the receiver run as separate launches, as an operator runs them, with the
missing-records topic configured; a stream of records flows at a steady rate while receiver
processes are killed, the whole receiver is restarted, or the destination broker stops. At the
end every source record is accounted for, record by record: written exactly once, or reported
missing (and then never written), with the reason.
"""

import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from diode.runtime import launches
from tests.conftest import (create_topic, missing_event, produce, read_until, wait_for,
                            write_topology)

PARTITIONS = 4


def durable_topology(tmp_path, src, dst, **overrides):
    receiver = {"missing.records.topic": "missing", "reorder.wait.ms": 500,
                "checkpoint.interval.ms": 500, "journal.segment.bytes": 262144,
                "stages": {"unpacker": {"instances": 2}, "kafka_writer": {"instances": 2}}}
    receiver.update(overrides.pop("receiver", {}))
    sender = {"heartbeat.interval.ms": 500, **overrides.pop("sender", {})}
    supervisor = {"restart.max": 20, **overrides.pop("supervisor", {})}
    return write_topology(tmp_path, src.bootstrap, dst.bootstrap, receiver=receiver,
                          sender=sender, supervisor=supervisor, **overrides)


class Stream:
    """Records produced to the source at `rate` per second in a thread; each remembers when it
    was produced, so a test knows which were sent while the receiver was down. `batch(first,
    end)`: records first..end-1 to produce to `topic` (by default the 4 partitions of "src")."""

    def __init__(self, bootstrap, total: int, rate: int, first: int = 0, topic="src",
                 batch=None, timeout: float = 120):
        self.bootstrap, self.total, self.rate = bootstrap, total, rate
        self.first, self.topic, self.timeout = first, topic, timeout
        self.batch = batch or source_records
        self.produced_at: list = []  # (time.monotonic() once acknowledged, records so far)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Stream":
        self.thread.start()
        return self

    def _run(self):
        chunk = max(1, self.rate // 10)
        next_at = time.monotonic()
        for start in range(self.first, self.total, chunk):
            end = min(start + chunk, self.total)
            produce(self.bootstrap, self.topic, self.batch(start, end))
            self.produced_at.append((time.monotonic(), end))
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))  # (pacing: `rate` per second)

    def join(self):
        self.thread.join(self.timeout)
        assert not self.thread.is_alive(), "the source stream did not finish"

    def produced_between(self, start: float, end: float) -> int:
        """How many records were produced (acknowledged) between two time.monotonic()s."""
        before = [n for t, n in self.produced_at if t < start]
        until = [n for t, n in self.produced_at if t <= end]
        return (until[-1] if until else self.first) - (before[-1] if before else self.first)


def source_records(first: int, end: int) -> list:
    """Records first..end-1 of a Stream's default source: over its PARTITIONS, keys cycling."""
    return [{"value": b"r%06d" % i + b"." * 100, "key": b"k%d" % (i % 97),
             "partition": i % PARTITIONS} for i in range(first, end)]


@dataclass
class Audit:
    written: Counter = field(default_factory=Counter)  # (partition, offset) -> copies
    missing: dict = field(default_factory=dict)        # (partition, offset) -> reasons
    events: list = field(default_factory=list)

    def expected(self, total: int) -> set:
        per = total // PARTITIONS
        return {(p, o) for p in range(PARTITIONS) for o in range(per)}

    def silent(self, total: int) -> set:
        return self.expected(total) - set(self.written) - set(self.missing)

    @property
    def false_missing(self) -> set:
        return set(self.written) & set(self.missing)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.written.values())

    @property
    def reported_twice(self) -> list:
        return [k for k, reasons in self.missing.items() if len(reasons) > 1]

    def summary(self, total: int) -> str:
        return (f"written {len(self.written)}, missing {len(self.missing)}, silent "
                f"{len(self.silent(total))}, false missing {len(self.false_missing)}, "
                f"duplicates {self.duplicates}, events {self.events[:10]}")


def audit(dst, total: int, timeout: float = 120, idle: float = 3.0) -> Audit:
    """Read the destination topic and the missing-records topic until every source record is
    written or reported (then `idle` seconds more, for extras), or `timeout`."""
    a = Audit()

    def take(m):
        if m.topic() == "missing":
            e, offsets = missing_event(m)
            a.events.append(e)
            for o in offsets:
                a.missing.setdefault((e["sourcePartition"], o), []).append(e["reason"])
        else:
            h = dict(m.headers())
            a.written[(int(h["sourcePartition"]), int(h["sourceOffset"]))] += 1
    read_until(dst.bootstrap, ("dst_src", "missing"), take, lambda: not a.silent(total),
               timeout, idle)
    return a


def settled(stream, dst, total: int, receiver, **audit_options):
    """After the stream: every record written once or reported, none silently lost and none
    written twice. Returns the audit and the receiver's log."""
    stream.join()
    a = audit(dst, total, **audit_options)
    out = receiver.output()
    assert not a.silent(total), \
        f"lost silently: {a.summary(total)}\n{writers(receiver)}\n{own_lines(out)}"
    assert a.duplicates == 0, f"written twice: {a.summary(total)}"
    return a, out


def own_lines(out: str, chars: int = 5000) -> str:
    """The end of a side's log without librdkafka's own lines (a broker down fills it with
    "Connection refused"), for a failure's message."""
    return "\n".join(line for line in out.splitlines() if not line.startswith("%"))[-chars:]


def writers(receiver) -> str:
    """Each kafka_writer's counts as its metrics last said, for a failure's message: which
    one held records back, and where."""
    from diode.runtime import launches
    names = ("records", "backlog_records", "pending_records", "checkpoints")
    return "; ".join(f"{w}: " + ", ".join(f"{n} {v:.0f}" for n, v in counts.items())
                     for w, counts in sorted(launches.worker_counters(
                         receiver.run_dir, names, "kafka_writer").items()))


def written_some(receiver, timeout: float = 60) -> None:
    """Until the receiver's writers have written records of the stream."""
    wait_for(lambda: receiver.metric("records", "kafka_writer") > 0, timeout,
             f"records written to the destination\n{receiver.output()[-3000:]}")


def start_pair(launch, topo, receiver_workers=5):
    receiver = launch(topo, side="receiver", workers=receiver_workers)
    sender = launch(topo, side="sender", workers=3)
    return sender, receiver


def streaming(tmp_path, brokers, launch, total: int, rate: int, batch=None, **overrides):
    """Sender and receiver launched apart, and `total` records streaming at `rate` (`batch`:
    as Stream's): (topology, sender, receiver, stream)."""
    src, dst = brokers
    create_topic(src.bootstrap, "src", PARTITIONS)
    topo = durable_topology(tmp_path, src, dst, **overrides)
    sender, receiver = start_pair(launch, topo)
    return topo, sender, receiver, Stream(src.bootstrap, total, rate, batch=batch).start()


def test_receiver_workers_killed_mid_stream_lose_nothing_and_report_nothing(tmp_path, brokers,
                                                                            launch):
    """kill -9 of writers, unpackers and the UDP reader, several times, while 16 000 records
    stream: each record written once, none reported missing."""
    total = 16000
    _, sender, receiver, stream = streaming(tmp_path, brokers, launch, total, 2000)
    killed = []
    for victim in ["receiver/kafka_writer-0", "receiver/unpacker-1", "receiver/udp_reader-0",
                   "receiver/kafka_writer-1", "receiver/unpacker-0", "receiver/udp_reader-0",
                   "receiver/kafka_writer-0"]:
        time.sleep(1.0)  # (pacing: the kills are spread over the stream)
        w = receiver.wait_workers(5)  # the previous victim is back
        w[victim].send_signal(signal.SIGKILL)
        killed.append(victim)
    a, out = settled(stream, brokers[1], total, receiver)
    assert not a.missing, f"false missing reports after killing {killed}: {a.summary(total)}"
    assert "replaying the journal" in out
    # what the writers checkpointed leaves the journal: its first segments are gone
    first = min(int(f.name.split(".")[0]) for f in (tmp_path / "diode-journal").glob("*.journal"))
    assert first > 0, out
    assert sender.stop() == 0 and receiver.stop() == 0


def _restart_receiver(tmp_path, brokers, launch, kill: bool):
    total, rate = 16000, 2000
    topo, sender, receiver, stream = streaming(tmp_path, brokers, launch, total, rate)
    written_some(receiver)
    went = time.monotonic()
    if kill:
        receiver.kill()  # every receiver process, the supervisor included: SIGKILL
    else:
        assert receiver.stop() == 0
    time.sleep(3)  # (the outage under test: the sender sends, nothing receives)
    receiver = launch(topo, side="receiver", workers=5)
    back = time.monotonic()
    a, out = settled(stream, brokers[1], total, receiver)
    assert not a.false_missing, f"written yet reported missing: {a.summary(total)}"
    assert not a.reported_twice, f"reported twice: {a.reported_twice[:5]}"
    # Only what was sent while no receiver read is missing, as such, and no more than the
    # stream produced from just before the receiver went (the sender may still have been
    # sending those) until it was back.
    assert a.missing, "records sent while the receiver was down cannot have arrived"
    assert {r for reasons in a.missing.values() for r in reasons} == {"receiver-down"}, \
        ([e for e in a.events if e.get("reason") != "receiver-down"], a.events, out[-8000:])
    assert len(a.missing) <= stream.produced_between(went - 2, back), a.summary(total)
    assert sender.stop() == 0 and receiver.stop() == 0


def test_receiver_stopped_and_started_reports_exactly_what_it_could_not_receive(
        tmp_path, brokers, launch):
    _restart_receiver(tmp_path, brokers, launch, kill=False)


def test_whole_receiver_side_killed_reports_exactly_what_it_could_not_receive(
        tmp_path, brokers, launch):
    _restart_receiver(tmp_path, brokers, launch, kill=True)


def test_destination_down_for_a_minute_loses_nothing_and_restarts_nothing(tmp_path,
                                                                          start_brokers,
                                                                          launch):
    """Apache Kafka only (Tansu loses its records when it stops). The writer's producer queue
    is kept small, and the records are of 1 KB, so that the outage backs up into the journal:
    the queues between the receiver's workers hold messages up to a bound in bytes too (the
    kernel's socket buffers), which took all of 16 000 records of 100 B that had not reached
    the producers when the outage began."""
    src, dst = start_brokers("kafka", "source", "destination")
    total = 16000
    _, sender, receiver, stream = streaming(
        tmp_path, (src, dst), launch, total, 1000,
        batch=lambda first, end: [dict(r, value=r["value"] + b"." * 900)
                                  for r in source_records(first, end)],
        receiver={"kafka": {"bootstrap.servers": dst.bootstrap,
                            "queue.buffering.max.messages": 2000}})
    written_some(receiver)
    dst.stop(keep_data=True)
    held = 0.0  # the most the journal held that the writers could not take yet
    for _ in range(60):
        time.sleep(1)  # (the outage under test lasts a minute; sampled each second)
        held = max(held, receiver.metric("journal_unforwarded_bytes", "udp_reader"))
    dst.start()
    a, out = settled(stream, dst, total, receiver, timeout=180)
    assert not a.missing, a.summary(total) + "\n" + out[-5000:]
    # (but for a writer whose producer stayed stuck after the outage, started afresh on
    # purpose: diode.writer.stall; it loses nothing, as the audit above shows)
    assert "restart 1 of" not in out or "starting this writer afresh" in out, own_lines(out)
    assert held > 0, "the outage never backed up into the journal"
    assert "the link, the sender or its source cluster is down" not in out
    assert sender.stop() == 0 and receiver.stop() == 0


def test_a_source_cluster_that_stops_answering_does_not_silence_the_sender(tmp_path, brokers,
                                                                          launch):
    """The source cluster frozen (SIGSTOP: every request waits) for 8 s while the sender looks
    for new partitions every second: its heartbeats go on, so the receiver never takes it for a
    dead link, and every record crosses once the cluster answers again."""
    total = 4000
    _, sender, receiver, stream = streaming(tmp_path, brokers, launch, total, 2000)
    stream.join()
    wait_for(lambda: sender.metric("records", "kafka_reader") >= total, 60,
             "the sender to read every record")
    brokers[0].pause()
    try:
        time.sleep(8)  # (the freeze under test: longer than the receiver's heartbeat wait)
    finally:
        brokers[0].resume()
    a, out = settled(stream, brokers[1], total, receiver)
    assert not a.missing, a.summary(total)
    assert "no heartbeat from the sender" not in out, out[-3000:]
    assert sender.stop() == 0 and receiver.stop() == 0


def test_a_destination_that_stops_answering_while_its_topics_are_prepared_restarts_nothing(
        tmp_path, brokers, launch):
    """The destination frozen (SIGSTOP: every request waits) from before the first record until
    well past the supervisor's heartbeat timeout, while the writers must read what it holds,
    create its topics and write the sender's heartbeats there: they ask from a thread, hold the
    records meanwhile, and go on beating, so no worker is restarted; once it answers every
    record is written exactly once and none is reported missing."""
    src, dst = brokers
    timeout = 6  # the supervisor's heartbeat timeout: a writer waiting on the cluster in its
    #              loop (a metadata request times out after 5 s) would be killed
    create_topic(src.bootstrap, "src", PARTITIONS)
    topo = durable_topology(tmp_path, src, dst, receiver={"heartbeat.topic": "beats"},
                            supervisor={"heartbeat.timeout.seconds": timeout})
    sender, receiver = start_pair(launch, topo)
    total = 6000
    dst.pause()
    try:
        stream = Stream(src.bootstrap, total, 1000).start()
        wait_for(lambda: receiver.metric("records", "unpacker") > 0, 30,
                 "records unpacked for the writers")
        time.sleep(2 * timeout)  # (the outage: the writers hold what comes meanwhile)
        held = receiver.metric("backlog_records", "kafka_writer")
    finally:
        dst.resume()
    a, out = settled(stream, dst, total, receiver, timeout=180)
    status = launches.read_status(str(receiver.run_dir))
    assert status and all(w["restarts"] == 0 for w in status["workers"]), (status, out[-5000:])
    assert "sent no heartbeat" not in out, out[-5000:]
    assert not a.missing, a.summary(total) + "\n" + out[-5000:]
    assert held > 0, "nothing waited for the destination"
    assert sender.stop() == 0 and receiver.stop() == 0


def test_records_the_destination_refuses_go_to_the_dead_letter_topic_and_others_flow(
        tmp_path, start_brokers, launch):
    """Apache Kafka only (Tansu enforces no topic limits). A destination topic whose records
    are too large for it, and one whose name the cluster refuses, send their records to the
    receiver's dead-letter topic with the error; a third topic flows all the while."""
    src, dst = start_brokers("kafka", "source", "destination")
    for topic, partitions in (("src", 2), ("good", 1), ("bad", 1)):
        create_topic(src.bootstrap, topic, partitions)
    create_topic(dst.bootstrap, "dst_src", 2, {"max.message.bytes": "20000"})
    topo = durable_topology(tmp_path, src, dst,
                            sender={"topics": ["src", "good", "bad"]},
                            receiver={"topic.rename": {"bad": "bad/name"},
                                      # (the low side's limit, kept: not the source's)
                                      "topic.configs": {"dst_src": {
                                          "max.message.bytes": "20000"}}})
    start_pair(launch, topo)
    produce(src.bootstrap, "src", [{"value": b"small %d" % i, "partition": 0}
                                   for i in range(20)] +
            [{"value": b"L" * 50000, "key": b"large %d" % i, "partition": 1} for i in range(5)])
    produce(src.bootstrap, "bad", [{"value": b"bad %d" % i} for i in range(10)])
    produce(src.bootstrap, "good", [{"value": b"good %d" % i} for i in range(50)])
    got: dict = {}
    read_until(dst.bootstrap, ("diode-dead-letter", "dst_good", "dst_src", "missing"),
               lambda m: got.setdefault(m.topic(), []).append(m),
               lambda: (len(got.get("diode-dead-letter", [])) >= 15 and
                        len(got.get("dst_good", [])) >= 50 and len(got.get("dst_src", [])) >= 20),
               timeout=90, idle=0)
    assert sorted(m.value() for m in got.get("dst_good", [])) == \
        sorted(b"good %d" % i for i in range(50))
    assert sorted(m.value() for m in got.get("dst_src", [])) == \
        sorted(b"small %d" % i for i in range(20))
    dead = got.get("diode-dead-letter", [])
    by_topic: dict = {}
    for m in dead:
        h = dict(m.headers() or [])
        assert "sourceTopic" in h, (m.key(), m.headers())
        by_topic.setdefault(h["sourceTopic"], []).append((int(h["sourceOffset"]), h))
    assert sorted(o for o, _ in by_topic[b"src"]) == list(range(5))
    assert all(b"too large" in h["diode.error"].lower() or b"size" in h["diode.error"].lower()
               for _, h in by_topic[b"src"]), by_topic[b"src"][0][1]
    assert sorted(o for o, _ in by_topic[b"bad"]) == list(range(10))
    assert all(h["diode.destination.topic"] == b"bad/name" for _, h in by_topic[b"bad"])
    assert {m.key() for m in dead if m.key()} >= {b"large %d" % i for i in range(5)}
    assert not got.get("missing"), [m.value() for m in got["missing"]]


def test_a_journal_directory_that_cannot_be_written_is_a_clear_error_at_start(tmp_path,
                                                                               launch):
    (tmp_path / "a-file").write_text("in the way")
    topo = write_topology(tmp_path, "127.0.0.1:9", "127.0.0.1:9",
                          receiver={"journal.dir": "a-file/journal"})
    d = launch(topo, side="receiver")
    assert d.proc.wait(60) == 1
    out = d.output()
    assert "a-file/journal" in out and "Traceback" not in out, out
    assert "receiver/" not in out  # no worker was started, so none restarts in a loop
