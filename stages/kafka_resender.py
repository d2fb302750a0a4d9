"""kafka_resender: the kafka_reader of `diode resend`, which sends a manifest's ranges again.

Not a stage type of the topology: `diode resend` (diode.resend) has the supervisor run it in
kafka_reader's place, made for its ranges (`Stage.for_ranges`). It is the reader
(stages.kafka_reader) with these differences:

- it reads exactly the ranges of its own partitions (diode.link.records.partition_owner),
  assigned once at the start of their first range, far gaps between ranges skipped with a seek;
- its runs are outside any chain (prev diode.link.records.RESEND): no heartbeats, no lineage
  remembered, no watchers of the source's partitions or metadata, no commits to the consumer
  group (the running sender's chains and offsets are left alone);
- per range read through, a digest of the records the source holds in it (on a compacted
  topic fewer than its offsets), so that the receiver knows when its ticket is filled; none
  after a rewind, whose ranges are read again from mid-way;
- it finishes: once every range is sent and acknowledged its after_input returns False (the
  runtime's loop ends) and it exits 0, and the supervisor, seeing every worker of a FINISHES
  stage done, drains the launch.
"""

from collections import deque
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from diode.accounting.digests import Digest, new_range, record_hash
from diode.kafka import identity
from diode.kafka.clients import admin_config, consumer_config
from diode.kafka.refresh import topic_ids
from diode.link.records import RESEND, partition_owner
from stages import kafka_reader

SEEK_GAP = 10000  # offsets between two ranges worth a seek rather than a read


@dataclass
class RangeSum:
    """What was read so far of the range being read of a partition."""
    range: list    # [first, last]
    records: int   # how many records the source held in it up to now
    hasher: object  # their digest so far (diode.accounting.digests.new_range)


class Stage(kafka_reader.Stage):
    STOPPING_BEATS = 0  # (it sends no heartbeats: its runs are outside any chain)
    PARTITION_EOF = True  # (the end of a partition before a range's end: nothing more comes)
    FINISHES = "resend"
    # {(topic, partition): [[first, last], ...]}: the manifest's ranges (for_ranges)
    RANGES: dict = {}

    @classmethod
    def for_ranges(cls, ranges: dict) -> type:
        """This stage, sending `ranges` ({(topic, partition): [[first, last], ...]}) again:
        the class `diode resend` has the supervisor run in kafka_reader's place."""
        return type(cls.__name__, (cls,), {"RANGES": ranges})

    def _watch_source(self) -> None:
        """No watchers: the ranges of this reader's partitions, and each topic's incarnation,
        asked once."""
        # (topic, partition) -> the ranges left to read of it, in offset order
        self.left = {tp: deque(sorted(ranges)) for tp, ranges in self.RANGES.items()
                     if self.selector.index == partition_owner(*tp, self.selector.readers)}
        self.looked_at: dict = {}  # (topic, partition) -> last offset looked at
        self.sums: dict = {}       # (topic, partition) -> RangeSum of the range being read
        self.tainted = False       # rewound: ranges read again from mid-way
        self._identities()

    def _identities(self) -> None:
        """The incarnation of each topic of the manifest, asked once."""
        topics = sorted({t for t, _ in self.left})
        try:
            ids = topic_ids(AdminClient(admin_config(consumer_config(self.t))), topics)
        except KafkaException as exc:
            self.log.error("cannot read the source topics' ids (%s): resent records carry no "
                           "incarnation", exc)
            return
        self.lineage.incarnations = {t: inc for t, inc in ids.items()
                                     if inc != identity.NO_INCARNATION}

    # -- the loop ----------------------------------------------------------------------------

    def _deadlines(self) -> None:
        """One timer: the partitions of the manifest assigned (_refresh). No heartbeat, no
        metadata, no commit."""
        self.every(kafka_reader.REFRESH_TAKE_SECONDS, self._take_found)

    def after_input(self, now):
        """No chain, no commit: the digests of the ranges read through handed on; done (False)
        when every range is sent."""
        if self.digests and not self.out.full:
            self._hand_digests(resend=True)
        if not any(self.left.values()) and not self.tracker.inflight and \
                not len(self.out) and not self.digests:
            self.log.info("resend complete")
            return False
        return True

    def _refresh(self):
        """Assign each partition of the manifest at the start of its first range (once)."""
        tps = [TopicPartition(t, p, ranges[0][0]) for (t, p), ranges in self.left.items()
               if (t, p) not in self.assigned and ranges]
        if not tps:
            return
        for tp in tps:
            self.assigned[(tp.topic, tp.partition)] = tp.offset
        self.consumer.assign(tps)
        self.log.info("resending %d range(s) of %d partition(s)",
                      sum(map(len, self.left.values())), len(tps))

    def _records(self, msgs: list) -> list:
        return [m for m in msgs if self._to_send(m)]

    def _chain(self, tp, first: int, last: int) -> int:
        return RESEND  # (outside any chain)

    def _to_send(self, m) -> bool:
        """Whether a consumed message is a record of a range; the end of a partition, or
        offsets the source no longer holds, end the partition's resend."""
        err = m.error()
        if err is None:
            return self._in_range(m)
        tp = (m.topic(), m.partition())
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            self.log.error("%s[%d]: the source no longer holds the offsets to resend (%s); "
                           "skipping the partition", tp[0], tp[1], err.str())
            self._done(tp)
        elif err.code() == KafkaError._PARTITION_EOF:
            ranges = self.left.get(tp)
            # The log ends before the range we wait for, or after the last range (whose
            # records came before this end): nothing more will come. (An end of partition seen
            # by a fetch from before a seek is no reason to stop.)
            if ranges and (m.offset() <= ranges[0][0] or m.offset() > ranges[-1][1]):
                if m.offset() > ranges[-1][1]:  # every range was read through
                    while ranges:
                        self._range_read(tp, ranges.popleft())
                self._done(tp)
        else:
            return super()._to_send(m)
        return False

    def _in_range(self, m) -> bool:
        """Whether a record is in a range of its partition. Records come in offset order; far
        gaps between ranges are skipped with a seek, and what a seek delivers twice (messages
        fetched before it) is recognised by offset."""
        tp, offset = (m.topic(), m.partition()), m.offset()
        if offset <= self.looked_at.get(tp, -1):
            return False
        self.looked_at[tp] = offset
        ranges = self.left.get(tp)
        while ranges and offset > ranges[0][1]:
            self._range_read(tp, ranges.popleft())
        if not ranges:
            self._done(tp)
            return False
        if offset < ranges[0][0]:
            if ranges[0][0] - offset > SEEK_GAP:
                self.consumer.seek(TopicPartition(tp[0], tp[1], ranges[0][0]))
            return False
        rng = ranges[0]
        acc = self.sums.get(tp)
        if acc is None or acc.range is not rng:
            acc = self.sums[tp] = RangeSum(rng, 0, new_range())
        acc.records += 1
        acc.hasher.update(record_hash(m.key(), m.value(), m.headers(), m.timestamp()[1]))
        return True

    def _range_read(self, tp, rng) -> None:
        """A range of the manifest read through: its digest says how many records the source
        holds in it (on a compacted topic, fewer than its offsets), so that the receiver knows
        when its ticket is filled. None after a rewind (its count would be short)."""
        acc = self.sums.pop(tp, None)
        if self.tainted:
            return
        count, hasher = (acc.records, acc.hasher) if acc is not None and acc.range is rng \
            else (0, new_range())
        self.digests.append(Digest(tp[0], tp[1], self.lineage.incarnation(tp[0]), rng[0],
                                   rng[1], count, hasher.digest()))

    def _done(self, tp) -> None:
        if self.left.get(tp) is not None and tp in self.assigned:
            self.left[tp] = deque()
            self.consumer.incremental_unassign([TopicPartition(*tp)])
            del self.assigned[tp]

    def rewind(self):
        self.tainted = True  # (ranges read again from mid-way)
        self.sums.clear()
        super().rewind()

    def _commit(self, sync=False):
        pass  # a resend leaves the consumer group's offsets alone
