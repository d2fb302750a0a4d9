"""kafka_writer: writes records to the destination cluster, with their provenance.

A record keeps key, value, headers and timestamp and gains sourceTopic, sourcePartition and
sourceOffset (UTF-8 strings). It goes to prefix + source topic (or receiver.topic.rename) on the
same partition number when the destination topic has enough partitions. A destination topic that
does not exist is created with the source topic's partition count.

When the destination cluster is down the producer keeps retrying and its bounded queue fills:
the writer then stops taking input, which backs up through the unpackers to the UDP socket.
"""

import time

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from diode import transport
from diode.kafka import admin_config, partition_counts, producer_config
from diode.records import TIMESTAMP_NOT_AVAILABLE, provenance_headers
from diode.worker import Stage as BaseStage

MAX_PARTITIONS = 10000


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        kafka = self.t.receiver.kafka
        self.input = transport.pull(ctx.zmq, ctx.endpoint("kafka_writer", ctx.spec.index),
                                    ctx.hwm)
        self.producer = Producer(producer_config(kafka, **{"message.timeout.ms": 0}))
        self.admin = AdminClient(admin_config(kafka))
        self.dest_partitions: dict = {}   # destination topic -> partition count
        self.source_partitions: dict = {}  # source topic -> partition count (from the sender)
        self.next_metadata = 0.0
        self.backlog: list = []           # records taken but not yet accepted by the producer

    def destination(self, topic: str) -> str:
        r = self.t.receiver
        return r.topic_rename.get(topic) or r.topic_prefix + topic

    def step(self):
        self.producer.poll(0)
        if self.backlog:
            self._produce_backlog()
            return True
        got = self.input.poll(50)
        if self.drained(idle=not got):
            self._flush()
            return False
        if not got:
            return True
        for (frame,) in transport.drain(self.input, 16):
            records, counts = transport.loads(frame)
            self.source_partitions.update(counts)
            self.backlog.extend(records)
        self._produce_backlog()
        return True

    def _produce_backlog(self):
        produced = 0
        for r in self.backlog:
            topic = self.destination(r.topic)
            n = self.dest_partitions.get(topic)
            if n is None and not self._ensure_topic(topic, r.topic):
                time.sleep(0.05)  # not visible yet: keep the records, in order, and retry
                break
            kwargs = {"partition": r.partition} if r.partition < self.dest_partitions[topic] \
                else {}
            if r.timestamp_type != TIMESTAMP_NOT_AVAILABLE:
                kwargs["timestamp"] = r.timestamp
            try:
                self.producer.produce(topic, value=r.value, key=r.key,
                                      headers=provenance_headers(r),
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

    def _ensure_topic(self, topic: str, source_topic: str) -> bool:
        """Learn the destination topic's partition count, creating the topic with the source's
        partition count if it does not exist. At most once a second; False until it is known."""
        now = time.monotonic()
        if now < self.next_metadata:
            return False
        self.next_metadata = now + 1.0
        try:
            self.dest_partitions.update(partition_counts(self.producer))
            if topic in self.dest_partitions:
                return True
            n = max(1, min(int(self.source_partitions.get(source_topic, 1)), MAX_PARTITIONS))
            try:
                self.admin.create_topics([NewTopic(topic, n)], operation_timeout=10)[topic] \
                    .result(15)
                self.log.info("created destination topic %s with %d partition(s)", topic, n)
            except KafkaException as exc:
                self.log.info("destination topic %s: %s", topic, exc.args[0])
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
