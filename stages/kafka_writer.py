"""kafka_writer: writes records to the destination cluster, with their provenance.

A record keeps key, value, headers and timestamp and gains sourceTopic, sourcePartition and
sourceOffset (UTF-8 strings), then receiver.written.at.header (when it was written). It goes to
prefix + source topic (or receiver.topic.rename) on the same partition number when the
destination topic has enough partitions. A destination topic that does not exist is created with
the source topic's partition count.

The writer owns its source partitions' order, duplicates and gaps (diode.ordering): records are
held up to receiver.reorder.wait.ms to restore source order, duplicates are dropped, and missing
ranges (from the chain of offsets and the sender's heartbeats) are logged, counted and written to
receiver.missing.records.topic. Writer 0 also watches the sender's heartbeats: a silent link is
reported, and each heartbeat can be recorded in receiver.heartbeat.topic.

Records arrive as runs (diode.runs) and are decoded here, column by column; the produce call per
record is the only per-record object work. Delivery reports come for errors only
(delivery.report.only.error): what was written is what was produced, less what librdkafka still
holds, less what failed. Events (missing ranges, heartbeats) go through a producer of their own,
so that count stays exact.

When the destination cluster is down the producer keeps retrying and its bounded queue fills:
the writer then stops taking input, which backs up through the unpackers to the UDP socket.
"""

import json
import time
from collections import deque

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from diode import transport
from diode.errors import RejectedDatagram
from diode.kafka import (admin_config, client_settings, create_topic, partition_counts,
                         produce_run, producer_config)
from diode.ordering import PartitionState
from diode.ranges import merge
from diode.records import partition_owner
from diode.runs import Run
from diode.worker import Stage as BaseStage

MAX_PARTITIONS = 10000
MAX_BACKLOG_RECORDS = 20000  # records decoded and waiting for the producer; past it, no input
INPUT_MESSAGES = 16          # unpacker messages taken per step
WRITER_LINGER_MS = 50        # librdkafka's linger.ms unless receiver.kafka sets it
EXPIRE_ANYWAY_SECONDS = 1.0


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        kafka = client_settings(self.t, "receiver")
        self.input = transport.pull(ctx.zmq, ctx.endpoint("kafka_writer", ctx.spec.index),
                                    ctx.hwm)
        self.kafka = kafka
        self.producer = Producer(producer_config(kafka, **{
            # Records come in bursts of datagrams, not in a tight loop: a longer linger than
            # a relay needs fills the batches (the destination broker spent 8-11 µs per 100-byte
            # record at 5 ms, 5-7 at 50 ms, and the writer itself 5.4-7.8 against 4.4-5.9).
            "linger.ms": WRITER_LINGER_MS,
            "message.timeout.ms": 0, "delivery.report.only.error": True,
            "on_delivery": self._delivered,
            "message.max.bytes": self.t.receiver.max_record_bytes + 65536}))
        self.events = None  # the producer of missing-range and heartbeat events, when needed
        self.produced = 0   # records the producer accepted
        self.failed = 0     # records the destination refused
        self.admin = AdminClient(admin_config(kafka))
        self.dest_partitions: dict = {}   # destination topic -> partition count
        self.source_partitions: dict = {}  # source topic -> partition count (from the sender)
        self.next_metadata: dict = {}     # topic -> when its metadata may be asked again
        self.backlog = deque()            # [run, next index, columns] not yet all produced
        self.backlog_records = 0          # records in the backlog
        self.states: dict = {}            # (topic, partition) -> PartitionState
        self.next_expire = 0.0
        self.last_expire = 0.0
        self.last_beat = None             # when the last sender heartbeat arrived (writer 0)
        self.fills: dict = {}             # (topic, partition) -> offsets filled late, this step
        self.beat_interval = 1.0
        self.link_silent = False

    def destination(self, topic: str) -> str:
        r = self.t.receiver
        return r.topic_rename.get(topic) or r.topic_prefix + topic

    def step(self):
        self.producer.poll(0)
        if self.events is not None:
            self.events.poll(0)
        self.metrics.set("records", self.produced - self.failed - len(self.producer))
        if self.backlog_records >= MAX_BACKLOG_RECORDS:
            # The destination is behind: take no input, and expire nothing either, since what
            # a waiting run waits for may be in the input not taken (time stands still for it).
            self._produce_backlog()
            return True
        got = self.input.poll(0 if self.backlog else 50)
        if self.drained(idle=not got and not self.backlog):
            # Nothing more is coming: write what waits for a predecessor (reporting the gaps).
            self._expire(float("inf"))
            if self.backlog:
                self._produce_backlog()
                return True
            self._flush()
            return False
        taken = self._take_input() if got else 0
        now = time.monotonic()
        # Expire when the input was emptied (what a waiting run waits for is not sitting in
        # it), or at least every EXPIRE_ANYWAY_SECONDS under a steady full input, whose
        # oldest message is then a few steps old, far less than receiver.reorder.wait.ms.
        if now >= self.next_expire and (taken < INPUT_MESSAGES or
                                        now - self.last_expire >= EXPIRE_ANYWAY_SECONDS):
            self._expire(now)
            self.next_expire, self.last_expire = now + 0.05, now
        self._report_fills()
        if self.backlog:
            self._produce_backlog()
        return True

    def _take_input(self) -> int:
        """Offer what the unpackers sent to the partitions' states; returns the messages taken
        (INPUT_MESSAGES at most)."""
        now = time.monotonic()
        messages = transport.drain(self.input, INPUT_MESSAGES)
        states = self.states
        for frames in messages:
            claims, beats = transport.loads(frames[0])
            for t, p, chain_start, last_sent in claims:
                self._state(t, p).heartbeat(chain_start, last_sent, now)
            for frame in frames[1:]:
                run = self._decode(frame)
                if run is None:
                    continue
                tp = (run.topic, run.partition)
                state = states.get(tp) or self._state(*tp)
                wait = state.wait
                u = state.offer(run, now)
                if u.missing or u.filled:  # (the wait only lengthens on a fill)
                    self._apply(run.topic, run.partition, u, wait)
                else:  # the common case: runs to write, nothing to report
                    self._queue(u.writes)
            for beat in beats:
                self._beat(beat)
        return len(messages)

    def _queue(self, writes: list) -> None:
        """Runs to write, after those already waiting."""
        for run in writes:
            self.backlog.append([run, 0, None])
            self.backlog_records += len(run)

    def _decode(self, frame) -> Run | None:
        """A run from an unpacker; one that does not decode, or belongs to another writer, is
        counted and dropped (it came from an authenticated sender, so this is a bug there)."""
        try:
            run = Run.decode(frame)
        except RejectedDatagram as exc:
            self.metrics.inc("rejects", reason=exc.reason)
            self.log.error("dropped a run that does not decode: %s", exc)
            return None
        if partition_owner(run.topic, run.partition, self.ctx.instances("kafka_writer")) != \
                self.ctx.spec.index:
            self.metrics.inc("rejects", reason="misrouted")
            self.log.error("dropped a run of %s[%d], a partition another writer owns",
                           run.topic, run.partition)
            return None
        self.source_partitions[run.topic] = run.partition_count
        return run

    def _report_fills(self) -> None:
        for (topic, partition), offsets in self.fills.items():
            for first, last in merge([(o, o) for o in offsets]):
                self._event("filled", topic, partition, first, last, "late")
        self.fills.clear()

    # -- order, duplicates, gaps (diode.ordering) ----------------------------------------------

    def _state(self, topic: str, partition: int) -> PartitionState:
        state = self.states.get((topic, partition))
        if state is None:
            state = self.states[(topic, partition)] = PartitionState(
                self.t.receiver.reorder_wait_ms / 1000,
                max_wait=self.t.receiver.reorder_wait_max_ms / 1000)
        return state

    def _apply(self, topic: str, partition: int, u, wait: float | None = None) -> None:
        self._queue(u.writes)
        for m in u.missing:
            self._event("missing", topic, partition, m.first, m.last, m.reason)
        if u.filled:  # reported per run of offsets, once per step (_report_fills)
            self.fills.setdefault((topic, partition), []).extend(u.filled)
        state = self.states[(topic, partition)]
        if wait is not None and state.wait > wait:
            self.metrics.inc("reorder_wait_widened")
            self.log.warning("%s[%d]: records arrive later than the reorder wait: now waiting "
                             "%.1f s before reporting a gap (receiver.reorder.wait.max.ms)",
                             topic, partition, state.wait)

    def _expire(self, now: float) -> None:
        for (t, p), state in self.states.items():
            if state.busy:
                wait = state.wait
                self._apply(t, p, state.expire(now), wait)
        self._report_fills()
        self.metrics.set("duplicates", sum(s.duplicates for s in self.states.values()))
        self.metrics.set("pending_records", sum(s.pending_records for s in self.states.values()))
        if self.last_beat is not None and not self.link_silent and not self.stopping and \
                now - self.last_beat > 3 * self.beat_interval:
            self.link_silent = True
            self.metrics.set("link_silent", 1)
            self.log.warning("no heartbeat from the sender for %.0f s: the link, the sender or "
                             "its source cluster is down", now - self.last_beat)

    def _event(self, kind, topic, partition, first, last, reason) -> None:
        """A missing range (or a late record filling one): logged, counted, and written to the
        missing-records topic when there is one."""
        if kind == "missing":
            self.metrics.inc("missing_ranges")
            self.metrics.inc("missing_records", last - first + 1)
            self.log.warning("missing %s[%d] offsets %d..%d (%s)", topic, partition, first, last,
                             "lost on the link" if reason == "gap" else
                             "sent before the last heartbeat, never arrived")
        else:
            self.metrics.inc("late_records", last - first + 1)
            self.log.info("late records %s[%d]@%d..%d filled a missing range", topic, partition,
                          first, last)
        if self.t.receiver.missing_records_topic:
            event = {"type": kind, "sourceTopic": topic, "sourcePartition": partition,
                     "firstOffset": first, "lastOffset": last, "reason": reason,
                     "detectedAt": int(time.time() * 1000)}
            self._produce_event(self.t.receiver.missing_records_topic,
                                f"{topic}-{partition}", event)

    def _beat(self, beat: dict) -> None:
        now = time.monotonic()
        if self.link_silent:
            self.log.info("heartbeats again after %.0f s of silence", now - self.last_beat)
            self.link_silent = False
            self.metrics.set("link_silent", 0)
        self.last_beat = now
        self.beat_interval = beat["interval_ms"] / 1000
        self.metrics.inc("heartbeats")
        if self.t.receiver.heartbeat_topic:
            self._produce_event(self.t.receiver.heartbeat_topic, beat["session"], {
                "senderTime": beat.get("time_ms"), "receivedAt": int(time.time() * 1000),
                "reader": beat.get("reader"), "session": beat["session"],
                "partitions": len(beat["partitions"]), "counters": beat.get("counters", {}),
                "lastSent": [{"topic": t, "partition": p, "offset": last, "chainStart": start}
                             for t, p, start, last in beat["partitions"]]})

    def _produce_event(self, topic: str, key: str, event: dict) -> None:
        if topic not in self.dest_partitions:
            self._ensure_topic(topic, 1)
        if self.events is None:
            self.events = Producer(producer_config(self.kafka, **{
                "message.timeout.ms": 0, "on_delivery": self._event_delivered}))
        while True:
            try:
                self.events.produce(topic, key=key.encode(), value=json.dumps(event).encode())
                return
            except BufferError:
                self.events.poll(0.05)

    def _event_delivered(self, err, msg):
        if err is not None:
            self.metrics.inc("errors", reason="event")
            self.log.error("could not write to %s: %s", msg.topic(), err)

    def _produce_backlog(self):
        stamp = self.t.receiver.written_at_header
        written_at = [(stamp, str(int(time.time() * 1000)).encode())] if stamp else []
        backlog = self.backlog
        while backlog:
            entry = backlog[0]
            run = entry[0]
            topic = self.destination(run.topic)
            if topic not in self.dest_partitions and \
                    not self._ensure_topic(topic, self._source_partitions(run.topic)):
                time.sleep(0.05)  # not visible yet: keep the runs, in order, and retry
                break
            if entry[2] is None:
                entry[2] = (run.key_list(), run.value_list(), run.header_lists())
            partition = run.partition if run.partition < self.dest_partitions[topic] else -1
            done = produce_run(self.producer, topic, partition, run, entry[2], entry[1],
                               written_at)
            self.produced += done - entry[1]
            self.backlog_records -= done - entry[1]
            if done < len(run):
                entry[1] = done
                self.producer.poll(0.05)  # the destination is slow or down: wait, keep order
                break
            backlog.popleft()
        self.metrics.set("backlog_records", self.backlog_records)

    def _delivered(self, err, msg):
        """Called for records the destination refused (delivery.report.only.error)."""
        self.failed += 1
        self.metrics.inc("errors", reason="produce")
        self.log.error("a record was not written to %s[%s]: %s", msg.topic(), msg.partition(),
                       err)

    def _source_partitions(self, source_topic: str) -> int:
        """The partition count the sender gave for a source topic (a new destination's)."""
        return max(1, min(int(self.source_partitions.get(source_topic, 1)), MAX_PARTITIONS))

    def _ensure_topic(self, topic: str, partitions: int) -> bool:
        """Learn a destination topic's partition count, creating the topic with `partitions` if
        it does not exist. At most once a second per topic; False until it is known."""
        now = time.monotonic()
        if now < self.next_metadata.get(topic, 0.0):
            return False
        self.next_metadata[topic] = now + 1.0
        try:
            self.dest_partitions.update(partition_counts(self.producer))
            if topic in self.dest_partitions:
                return True
            if create_topic(self.admin, topic, partitions):
                self.log.info("created destination topic %s with %d partition(s)", topic,
                              partitions)
            self.dest_partitions.update(partition_counts(self.producer))
        except KafkaException as exc:
            self.log.warning("cannot read or create destination topic %s: %s; retrying", topic,
                             exc.args[0])
            self.metrics.inc("errors", reason="metadata")
        return topic in self.dest_partitions

    def _flush(self) -> None:
        if self.events is not None:
            self.events.flush(self.t.supervisor.drain_timeout_seconds * 0.25)
        left = self.producer.flush(self.t.supervisor.drain_timeout_seconds * 0.5)
        self.metrics.set("records", self.produced - self.failed - len(self.producer))
        if left:
            self.log.error("stopping with %d record(s) not confirmed by the destination "
                           "cluster", left)

    def close(self):
        self.producer.flush(1)
        if self.events is not None:
            self.events.flush(1)

