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

When the destination cluster is down the producer keeps retrying and its bounded queue fills:
the writer then stops taking input, which backs up through the unpackers to the UDP socket.
"""

import json
import time

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from diode import transport
from diode.kafka import (admin_config, client_settings, create_topic, partition_counts,
                         producer_config)
from diode.ordering import PartitionState
from diode.ranges import merge
from diode.records import TIMESTAMP_NOT_AVAILABLE, provenance_headers
from diode.worker import Stage as BaseStage

MAX_PARTITIONS = 10000


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        kafka = client_settings(self.t, "receiver")
        self.input = transport.pull(ctx.zmq, ctx.endpoint("kafka_writer", ctx.spec.index),
                                    ctx.hwm)
        self.producer = Producer(producer_config(kafka, **{
            "message.timeout.ms": 0,
            "message.max.bytes": self.t.receiver.max_record_bytes + 65536}))
        self.admin = AdminClient(admin_config(kafka))
        self.dest_partitions: dict = {}   # destination topic -> partition count
        self.source_partitions: dict = {}  # source topic -> partition count (from the sender)
        self.next_metadata: dict = {}     # topic -> when its metadata may be asked again
        self.backlog: list = []           # records taken but not yet accepted by the producer
        self.states: dict = {}            # (topic, partition) -> PartitionState
        self.next_expire = 0.0
        self.last_beat = None             # when the last sender heartbeat arrived (writer 0)
        self.fills: dict = {}             # (topic, partition) -> offsets filled late, this step
        self.beat_interval = 1.0
        self.link_silent = False

    def destination(self, topic: str) -> str:
        r = self.t.receiver
        return r.topic_rename.get(topic) or r.topic_prefix + topic

    def step(self):
        self.producer.poll(0)
        now = time.monotonic()
        if now >= self.next_expire:
            self._expire(now)
            self.next_expire = now + 0.05
        if self.backlog:
            self._produce_backlog()
            return True
        got = self.input.poll(50)
        if self.drained(idle=not got):
            # Nothing more is coming: write what waits for a predecessor (reporting the gaps).
            self._expire(float("inf"))
            if self.backlog:
                return True
            self._flush()
            return False
        if not got:
            return True
        now = time.monotonic()
        for (frame,) in transport.drain(self.input, 16):
            rows, counts, claims, beats = transport.loads(frame)
            records = transport.records_of(rows)
            self.source_partitions.update(counts)
            for t, p, chain_start, last_sent in claims:
                self._state(t, p).heartbeat(chain_start, last_sent, now)
            states, backlog = self.states, self.backlog
            for r in records:
                state = states.get((r.topic, r.partition)) or self._state(r.topic, r.partition)
                wait = state.wait
                u = state.offer(r, now)
                if u.missing or u.filled:  # (the wait only lengthens on a fill)
                    self._apply(r.topic, r.partition, u, wait)
                else:  # the common case: records to write, nothing to report
                    backlog.extend(u.writes)
            for beat in beats:
                self._beat(beat)
        self._report_fills()
        self._produce_backlog()
        return True

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
        self.backlog.extend(u.writes)
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
        self.metrics.set("pending_records", sum(len(s.pending) for s in self.states.values()))
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
        while True:
            try:
                self.producer.produce(topic, key=key.encode(), value=json.dumps(event).encode(),
                                      on_delivery=self._event_delivered)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _event_delivered(self, err, msg):
        if err is not None:
            self.metrics.inc("errors", reason="event")
            self.log.error("could not write to %s: %s", msg.topic(), err)

    def _produce_backlog(self):
        produced = 0
        stamp = self.t.receiver.written_at_header
        written_at = [(stamp, str(int(time.time() * 1000)).encode())] if stamp else []
        for r in self.backlog:
            topic = self.destination(r.topic)
            n = self.dest_partitions.get(topic)
            if n is None and not self._ensure_topic(topic, self._source_partitions(r.topic)):
                time.sleep(0.05)  # not visible yet: keep the records, in order, and retry
                break
            kwargs = {"partition": r.partition} if r.partition < self.dest_partitions[topic] \
                else {}
            if r.timestamp_type != TIMESTAMP_NOT_AVAILABLE:
                kwargs["timestamp"] = r.timestamp
            try:
                self.producer.produce(topic, value=r.value, key=r.key,
                                      headers=provenance_headers(r) + written_at,
                                      on_delivery=self._delivered, **kwargs)
            except BufferError:
                self.producer.poll(0.05)  # the destination is slow or down: wait, keep order
                break
            produced += 1
        del self.backlog[:produced]
        self.metrics.set("backlog_records", len(self.backlog))

    def _delivered(self, err, msg):
        if err is None:
            self.metrics.inc("records")
            return
        self.metrics.inc("errors", reason="produce")
        headers = dict(msg.headers() or [])
        self.log.error("record %s[%s]@%s was not written to %s: %s",
                       headers.get("sourceTopic", b"?").decode(),
                       headers.get("sourcePartition", b"?").decode(),
                       headers.get("sourceOffset", b"?").decode(), msg.topic(), err)

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
        left = self.producer.flush(self.t.supervisor.drain_timeout_seconds * 0.5)
        if left:
            self.log.error("stopping with %d record(s) not confirmed by the destination "
                           "cluster", left)

    def close(self):
        self.producer.flush(1)

