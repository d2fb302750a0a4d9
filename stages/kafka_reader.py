"""kafka_reader: reads the source topics with manual assignment and commits what was sent.

Each reader owns a fixed share of the source partitions (diode.kafka.clients.TopicSelector) and
looks for new topics and partitions every refresh.topics.interval.seconds, from a thread
(diode.kafka.refresh): a slow source cluster never holds up the loop or its heartbeats. What one
consume call returns goes to a packer as one message: a run per partition (diode.link.runs,
encoded here once, as it will cross the link) as ZeroMQ frames after a small header;
udp_senders (and packers, for dead-lettered records) acknowledge them back, and the longest
fully acknowledged prefix of each partition is committed to the source cluster's consumer group
(diode.kafka.offsets.SentTracker).

If acknowledgements stop coming (a packer or the udp_sender died: SIGUSR1 from the supervisor,
or inflight.timeout.seconds passed), the reader rewinds to its committed positions and reads
again: at least once.
"""

import os
import time
from collections import deque
from itertools import groupby
from operator import itemgetter

from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, Message,
                             TopicPartition)

from diode.link import runs
from diode.runtime import transport
from diode.kafka.clients import TopicSelector, consumer_config
from diode.kafka.refresh import PartitionWatcher
from diode.kafka.offsets import SentTracker
from diode.link.records import RESEND, partition_owner
from diode.runtime.worker import Stage as BaseStage

BATCH_RECORDS = 1000
REFRESH_TAKE_SECONDS = 0.1  # how often the loop takes what the partition watcher found
RESEND_SEEK_GAP = 10000  # offsets between two resend ranges worth a seek rather than a read


class Stage(BaseStage):
    def open(self):
        s = self.t.sender
        self.selector = TopicSelector(
            s.topics, s.topics_regex, exclude=[s.dead_letter_topic] if s.dead_letter_topic else [],
            index=self.ctx.spec.index, readers=self.ctx.instances("kafka_reader"))
        self.consumer = Consumer({**consumer_config(self.t), "on_commit": self._committed,
                                  "enable.partition.eof": s.resend is not None})
        self.acks = transport.pull(self.ctx.zmq, self.ctx.bound("acks"), self.ctx.hwm * 16)
        self.out = self.outbox(transport.push(self.ctx.zmq, self.ctx.peers("out"),
                                              self.ctx.hwm))
        self.tracker = SentTracker()
        self.position_committed: dict = {}  # (topic, partition) -> last offset committed
        self.assigned: dict = {}          # (topic, partition) -> start offset when assigned
        # The chain of offsets sent per partition (diode.accounting.ordering): where the current
        # chain started and the last offset dispatched; both forgotten when the reader rewinds.
        self.chain_start: dict = {}
        self.last_read: dict = {}
        self.next_heartbeat = 0.0
        # `diode resend`: exactly these ranges of this reader's partitions, no commits
        self.resend = None
        self.resend_pos: dict = {}  # (topic, partition) -> last offset looked at
        if s.resend is not None:
            self.resend = {tp: deque(sorted(ranges)) for tp, ranges in s.resend.items()
                           if self.selector.index == partition_owner(*tp, self.selector.readers)}
        self.counts: dict = {}            # topic -> partition count
        self.epoch = int.from_bytes(os.urandom(3), "big") << 32
        self.seq = 0
        self.next_refresh = 0.0
        # topics and partitions looked for off this loop (diode.kafka.refresh)
        self.watcher = None if self.resend is not None else PartitionWatcher(
            consumer_config(self.t), self.selector.owned,
            s.refresh_topics_interval_seconds).start()
        self.next_commit = time.monotonic() + s.offset_commit_interval_ms / 1000
        self.waiting_since = None         # when acknowledgements were last outstanding and new
        self.stop_deadline = None

    # -- partitions --------------------------------------------------------------------------

    def _refresh(self):
        """Start reading the partitions the watcher found (it asks the cluster off this loop,
        every refresh.topics.interval.seconds)."""
        if self.resend is not None:
            return self._assign_resend()
        start = OFFSET_BEGINNING if self.t.sender.start_position == "earliest" else OFFSET_END
        tps = []
        for found in self.watcher.take():
            if found.error is not None:
                self.log.warning("cannot read the source cluster's topics or committed offsets "
                                 "(%s); retrying", found.error)
                self.metrics.inc("errors", reason="metadata")
                continue
            self.counts = found.counts
            for tp in found.new:
                if (tp.topic, tp.partition) in self.assigned:
                    continue
                offset = tp.offset if tp.offset >= 0 else start
                self.assigned[(tp.topic, tp.partition)] = offset
                tps.append(TopicPartition(tp.topic, tp.partition, offset))
        if not tps:
            return
        self.consumer.incremental_assign(tps)
        self.log.info("reading %d new partition(s): %s", len(tps),
                      ", ".join(f"{t.topic}[{t.partition}]@{_where(t.offset)}" for t in tps))
        self.metrics.set("partitions", len(self.assigned))

    def _assign_resend(self):
        """Assign each partition of the manifest at the start of its first range (once)."""
        tps = [TopicPartition(t, p, ranges[0][0]) for (t, p), ranges in self.resend.items()
               if (t, p) not in self.assigned and ranges]
        if not tps:
            return
        for tp in tps:
            self.assigned[(tp.topic, tp.partition)] = tp.offset
        self.consumer.assign(tps)
        self.log.info("resending %d range(s) of %d partition(s)",
                      sum(map(len, self.resend.values())), len(tps))

    def _resend_filter(self, m) -> bool:
        """Whether a record read in resend mode is in a range of its partition. Records come in
        offset order; far gaps between ranges are skipped with a seek, and what a seek delivers
        twice (messages fetched before it) is recognised by offset."""
        tp, offset = (m.topic(), m.partition()), m.offset()
        if offset <= self.resend_pos.get(tp, -1):
            return False
        self.resend_pos[tp] = offset
        ranges = self.resend.get(tp)
        while ranges and offset > ranges[0][1]:
            ranges.popleft()
        if not ranges:
            self._resend_done(tp)
            return False
        if offset < ranges[0][0]:
            if ranges[0][0] - offset > RESEND_SEEK_GAP:
                self.consumer.seek(TopicPartition(tp[0], tp[1], ranges[0][0]))
            return False
        return True

    def _resend_done(self, tp) -> None:
        if self.resend.get(tp) is not None and tp in self.assigned:
            self.resend[tp] = deque()
            self.consumer.incremental_unassign([TopicPartition(*tp)])
            del self.assigned[tp]

    def rewind(self):
        """Read again everything after the committed positions."""
        positions = self.tracker.positions()
        lost = self.tracker.inflight
        self.tracker.reset()
        self.chain_start.clear()
        self.last_read.clear()
        self.epoch += 1 << 32  # acknowledgements of earlier messages are ignored from now
        self.out.clear()
        tps = [TopicPartition(t, p, positions.get((t, p), start))
               for (t, p), start in self.assigned.items()]
        if tps:
            self.consumer.assign(tps)
        self.waiting_since = None
        self.metrics.inc("rewinds")
        self.log.warning("rewound %d partition(s) to the committed positions: %d record(s) in "
                         "flight are read again", len(tps), lost)

    # -- the loop ----------------------------------------------------------------------------

    def step(self):
        now = time.monotonic()
        self._take_acks()
        if self.stopping:
            return self._drain_step(now)
        if now >= self.next_refresh:
            self._refresh()
            self.next_refresh = now + REFRESH_TAKE_SECONDS
        if self.out.flush() and self.tracker.inflight < self.t.sender.max_inflight_records \
                and self.assigned:
            self._read()
        else:
            self.acks.poll(20)
        self._check_stalled(now)
        if self.resend is not None:  # no chain, no commit: done when every range is sent
            if not any(self.resend.values()) and not self.tracker.inflight and \
                    not len(self.out):
                self.log.info("resend complete")
                return False
            return True
        if now >= self.next_heartbeat:
            self._heartbeat()
            self.next_heartbeat = now + self.t.sender.heartbeat_interval_ms / 1000
        if now >= self.next_commit:
            self._commit()
            self.next_commit = now + self.t.sender.offset_commit_interval_ms / 1000
        return True

    def _read(self):
        msgs = self.consumer.consume(BATCH_RECORDS, timeout=0.05)
        resend = self.resend is not None
        if resend or any(map(Message.error, msgs)):  # (the common case skips this pass)
            msgs = [m for m in msgs if self._to_send(m)]
        # grouped by partition without a Python frame per message
        groups: dict = {}  # (topic, partition) -> its messages, in offset order
        where = zip(map(Message.topic, msgs), map(Message.partition, msgs))
        for tp, same in groupby(zip(where, msgs), itemgetter(0)):
            groups.setdefault(tp, []).extend(map(itemgetter(1), same))
        if not groups:
            return
        frames, parts, counts = [], [], []
        for (topic, partition), group in groups.items():
            tp = (topic, partition)
            count = max(self.counts.get(topic, 0), partition + 1)
            prev = RESEND if resend else self.last_read.get(tp, -1)
            frames.append(runs.from_messages(topic, partition, count, prev, group))
            first, last = group[0].offset(), group[-1].offset()
            if not resend:
                self.last_read[tp] = last
                self.chain_start.setdefault(tp, first)
            parts.append((tp, last, len(group)))
            counts.append(len(group))
        self.seq += 1
        msg_id = self.epoch | self.seq
        self.tracker.dispatched(msg_id, parts)
        self.out.put([transport.dumps(("runs", self.ctx.spec.index, msg_id, counts)), *frames])
        self.metrics.inc("records", sum(counts))
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def _to_send(self, m) -> bool:
        """Whether a consumed message is a record to send: errors and ends of partitions are
        dealt with here, and a resend keeps only its ranges."""
        err = m.error()
        if err is None:
            return self.resend is None or self._resend_filter(m)
        if err.code() == KafkaError._PARTITION_EOF:
            tp = (m.topic(), m.partition())
            ranges = (self.resend or {}).get(tp)
            # The log ends before the range we wait for: nothing more will come. (An end of
            # partition seen by a fetch from before a seek is no reason to stop.)
            if ranges and m.offset() <= ranges[0][0]:
                self._resend_done(tp)
        else:
            self.log.warning("source cluster: %s", err)
            self.metrics.inc("errors", reason="consume")
        return False

    def _heartbeat(self):
        """Per partition of the current chains: where the chain started and the last offset
        handed to the kernel (the committed prefix). The packer that takes it sends it after
        whatever it holds."""
        positions = self.tracker.positions()
        parts = [[t, p, start, positions[(t, p)] - 1]
                 for (t, p), start in self.chain_start.items()
                 if positions.get((t, p), start) - 1 >= start]
        beat = {"reader": self.ctx.spec.index, "time_ms": int(time.time() * 1000),
                "interval_ms": self.t.sender.heartbeat_interval_ms, "partitions": parts,
                "counters": {"records": self.metrics.get("records"),
                             "rewinds": self.metrics.get("rewinds"),
                             "inflight": self.tracker.inflight}}
        if not self.out.full:
            self.out.put([transport.dumps(("heartbeat", beat))])
            self.metrics.inc("heartbeats")

    def _take_acks(self):
        progressed = False
        for (frame,) in transport.drain(self.acks):
            for msg_id, count in transport.loads(frame):
                self.tracker.acknowledged(msg_id, count)
                progressed = True
        if progressed:
            self.waiting_since = time.monotonic() if self.tracker.inflight else None
        self.metrics.set("inflight_records", self.tracker.inflight)

    def _check_stalled(self, now):
        timeout = self.t.sender.inflight_timeout_seconds
        if self.waiting_since is not None and self.tracker.inflight \
                and now - self.waiting_since > timeout:
            self.log.warning("no record acknowledged as sent for %.0f s", timeout)
            self.rewind()

    def _commit(self, sync=False):
        if self.resend is not None:
            return  # a resend leaves the consumer group's offsets alone
        changed = self.tracker.take_changed()
        changed.update(self._consumed_past_last_record())
        if not changed:
            return
        tps = [TopicPartition(t, p, offset) for (t, p), offset in changed.items()]
        try:
            self.consumer.commit(offsets=tps, asynchronous=not sync)
            self.metrics.inc("commits")
            self.position_committed.update(changed)
        except Exception as exc:
            self.log.warning("offset commit failed (%s); the next one covers it", exc)
            self.metrics.inc("errors", reason="commit")
            self.tracker.retry(changed)  # the next commit covers these
            self.position_committed.clear()

    def _consumed_past_last_record(self) -> dict:
        """Commit positions beyond the last record sent: a partition with nothing in flight is
        consumed up to the consumer's position, and what lies between its last record and that
        position holds nothing to send (transaction markers, aborted records). Without this a
        transactional topic would show a lag of 1 (its last commit marker) forever."""
        idle = [TopicPartition(t, p) for (t, p) in self.assigned if self.tracker.idle((t, p))]
        if not idle:
            return {}
        sent = self.tracker.positions()
        out = {}
        for tp in self.consumer.position(idle):
            key = (tp.topic, tp.partition)
            if tp.offset > sent.get(key, -1) and tp.offset > self.assigned[key] and \
                    tp.offset != self.position_committed.get(key):
                out[key] = tp.offset
        return out

    def _committed(self, err, partitions):
        """Commit result (served by consume()): failed positions are committed again."""
        failed = [(tp.topic, tp.partition) for tp in partitions if err or tp.error]
        if failed:
            self.position_committed.clear()
            self.log.warning("offset commit failed (%s); retrying", err or partitions[0].error)
            self.metrics.inc("errors", reason="commit")
            self.tracker.retry(failed)

    def _drain_step(self, now):
        """Read nothing more; wait for what is in flight to be sent, commit, finish."""
        if self.stop_deadline is None:
            self.stop_deadline = now + self.t.supervisor.drain_timeout_seconds * 0.75
        self.out.flush()
        if self.tracker.inflight and now < self.stop_deadline:
            self.acks.poll(20)
            return True
        if self.tracker.inflight:
            self.log.warning("stopping with %d record(s) not acknowledged as sent: they are "
                             "read again at the next start", self.tracker.inflight)
        self._commit(sync=True)
        return False

    def close(self):
        if self.watcher is not None:
            self.watcher.close()
        self.consumer.close()


def _where(offset):
    return {OFFSET_BEGINNING: "earliest", OFFSET_END: "latest"}.get(offset, offset)
