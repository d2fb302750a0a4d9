"""Heartbeats that claim idle partitions in bounded slices (sender.heartbeat.claims.max,
diode.kafka.claims) account every chain as exactly as heartbeats that claim every partition:
each claim says when its chain was first named, so a receiver started while the slices go
round joins the chains that ran before it, and one running when a chain starts accounts it from
its first offset (diode.accounting.ordering, "Where a chain starts")."""

import time

from diode.link import wire
from diode.link.linksim import Faults, FaultSettings
from tests.conftest import consume, create_topic, only_on, produce, source_coordinates, wait_for
from tests.integration.test_hostile_link import missing_offsets

IDLE, MOST = 16, 2  # partitions idle while the receiver starts; K = IDLE / MOST heartbeats
NEW = IDLE          # the partition whose chain starts while the receiver runs
RECORDS = 10        # per partition, before the receiver starts and again after


class DropNextData(Faults):
    """No faults, but the next data datagram after `arm()` is dropped."""

    def __init__(self):
        super().__init__(FaultSettings())
        self.armed = False
        self.dropped = 0

    def arm(self):
        self.armed = True

    def decide(self, datagram):
        if self.armed and wire.parse_header(datagram).kind == wire.KIND_DATA:
            self.armed = False
            self.dropped += 1
            return []
        return super().decide(datagram)


def values(partition: int, start: int) -> list:
    return [{"value": b"p%d-%d" % (partition, i), "partition": partition}
            for i in range(start, start + RECORDS)]


@only_on("tansu")  # (the heartbeats' slices decide it, not the broker)
def test_a_receiver_started_mid_rotation_reports_nothing_and_one_running_sees_a_lost_head(link):
    faults = DropNextData()
    lk = link(faults, receiver_later=True, sender={"heartbeat.claims.max": MOST})
    create_topic(lk.src.bootstrap, "src", IDLE + 1)
    produce(lk.src.bootstrap, "src", [r for p in range(IDLE) for r in values(p, 0)])
    wait_for(lambda: lk.sender.metric("records", "kafka_reader") >= IDLE * RECORDS, 60,
             "the sender to send the first records (to no receiver)")
    time.sleep(1)  # (their claims named in a heartbeat: the slices go round from there)

    # A receiver started now first hears heartbeats that name a slice of the idle partitions
    # (no record changes them); it learns of the others over the next K heartbeats. Their
    # chains ran before it: what they sent before it is not reported, and what they send
    # after is written, each record once.
    receiver = lk.start_receiver()
    k = IDLE // MOST
    wait_for(lambda: receiver.metric("heartbeats", "unpacker") >= 2 * k, 60,
             "two rounds of the slices heard")
    time.sleep(1)  # (the reorder wait of the last claims heard)
    produce(lk.src.bootstrap, "src", [r for p in range(IDLE) for r in values(p, RECORDS)])
    later = {("src", p, o) for p in range(IDLE) for o in range(RECORDS, 2 * RECORDS)}
    got = source_coordinates(consume(lk.dst.bootstrap, "dst_src", len(later), timeout=60,
                                     idle=1))
    assert sorted(got) == sorted(later)
    assert receiver.metric("missing_ranges", "kafka_writer") == 0

    # A chain that starts while the receiver runs (a partition's first records), its first
    # datagram lost: the receiver heard the reader before the chain was named, so it reports
    # the head lost, exactly, once a heartbeat naming the chain's start has waited.
    faults.arm()
    produce(lk.src.bootstrap, "src", values(NEW, 0))
    wait_for(lambda: faults.dropped, 30, "the new chain's first datagram dropped")
    produce(lk.src.bootstrap, "src", values(NEW, RECORDS))
    sent = {("src", NEW, o) for o in range(2 * RECORDS)}

    def settled():
        arrived = {c for c in source_coordinates(consume(lk.dst.bootstrap, "dst_src", 1,
                                                         timeout=5, idle=0.5)) if c[1] == NEW}
        reported, _ = missing_offsets(lk.dst.bootstrap, 1, timeout=3)
        return (arrived, reported) if arrived | reported >= sent else None
    arrived, reported = wait_for(settled, 60, "every record of the new chain written or "
                                              "reported missing")
    assert ("src", NEW, 0) in reported  # (the head)
    assert reported == sent - arrived    # (nothing else, of this chain or of the idle ones)
