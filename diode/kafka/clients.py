"""Kafka client settings and topic discovery, shared by the stages that talk to Kafka."""

import os
import re
from itertools import islice

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewPartitions, NewTopic

from diode.errors import SecretError
from diode.link.records import partition_owner
from diode.runtime.topology import REFERENCE, Topology

# The librdkafka settings that say how to reach a cluster (address, security, TLS, SASL), as
# opposed to a producer's or a consumer's tuning: what an admin client takes, and what the
# commands take from a topology's kafka section (diode.kafka.cluster).
CONNECTION_KEYS = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.id", "socket.",
                   "broker.address.family", "metadata.", "topic.metadata.")


def reference(kind: str, arg: str, path_of=os.path.abspath) -> str:
    """What ${env:NAME} or ${file:PATH} names: the variable's value, or the file's text without
    its final newline (PATH as `path_of` places it: a topology's references are relative to the
    topology file). SecretError saying what is missing, never a value."""
    arg = arg.strip()
    if kind == "env":
        if arg not in os.environ:
            raise SecretError(f"the environment variable {arg} is not set")
        return os.environ[arg]
    path = path_of(arg)
    try:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\r\n").decode()
    except OSError as exc:
        raise SecretError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SecretError(f"{path} is not UTF-8 text") from None


def resolved(value, where: str, path_of=os.path.abspath):
    """`value` with every ${file:PATH} and ${env:NAME} in it replaced by what it names (as
    `reference` reads it); SecretError naming `where` (the setting) and what is missing."""
    if not isinstance(value, str) or not REFERENCE.search(value):
        return value
    try:
        return REFERENCE.sub(lambda m: reference(*m.groups(), path_of), value)
    except SecretError as exc:
        raise SecretError(f"{where}: {exc}") from None


def client_settings(t: Topology, side: str) -> dict:
    """A side's librdkafka settings (sender: the source cluster, receiver: the destination)
    with every ${file:PATH} (relative to the topology file) and ${env:NAME} replaced by what it
    names. Made where the client is made; the values are never logged. SecretError names the
    setting and what could not be read."""
    return {key: resolved(value, f"{side}.kafka.{key}", t.resolve)
            for key, value in getattr(t, side).kafka.items()}


def consumer_config(t: Topology) -> dict:
    """The source cluster's librdkafka settings, with what at-least-once requires forced:
    offsets are stored and committed by the reader itself, only for what was sent; a position
    the source no longer holds is an error the reader handles (a recreated topic, or records
    deleted before they were read), never a silent jump (sender.start.position says where a
    partition without a committed offset starts)."""
    conf = {"group.id": f"diode-{t.name}", **client_settings(t, "sender")}
    conf.update({"enable.auto.commit": False, "enable.auto.offset.store": False,
                 "auto.offset.reset": "error"})
    return conf


def producer_config(kafka: dict, **defaults) -> dict:
    """A producer's settings: ours as defaults, the topology's on top, unchanged. Idempotence
    by default: a retried batch is never written twice nor out of order."""
    return {"linger.ms": 5, "acks": "all", "enable.idempotence": True, **defaults, **kafka}


def admin_config(kafka: dict) -> dict:
    """Only what connects (CONNECTION_KEYS): the admin client rejects producer/consumer-only
    properties."""
    return {k: v for k, v in kafka.items() if k.startswith(CONNECTION_KEYS)}


class TopicSelector:
    """Which source partitions a reader owns: topics by name or regex, split among readers.
    `exclude` names topics never selected, as a list or as {topic: why}."""

    def __init__(self, names, patterns, exclude=(), index: int = 0, readers: int = 1):
        self.names = set(names)
        self.patterns = [re.compile(p) for p in patterns]
        self.exclude = dict(exclude) if isinstance(exclude, dict) else \
            dict.fromkeys(exclude, "excluded")
        self.index = index
        self.readers = readers

    def matches(self, topic: str) -> bool:
        return self.why_not(topic) is None

    def why_not(self, topic: str) -> str | None:
        """Why `topic` is not selected, or None when it is."""
        if topic in self.exclude:
            return self.exclude[topic]
        if topic in self.names:
            return None
        if topic.startswith("__"):  # internal topics are never replicated by a pattern
            return "an internal topic, not named in sender.topics (a pattern never selects one)"
        if any(p.fullmatch(topic) for p in self.patterns):
            return None
        return "not in sender.topics" + (", and no pattern of sender.topics.regex matches it"
                                         if self.patterns else " (sender.topics.regex is empty)")

    def owned(self, partition_counts: dict) -> set:
        """(topic, partition) pairs this reader owns, from topic -> partition count."""
        return {
            (topic, p)
            for topic, n in partition_counts.items() if self.matches(topic)
            for p in range(n)
            if partition_owner(topic, p, self.readers) == self.index
        }


def replicated(s, index: int = 0, readers: int = 1) -> TopicSelector:
    """The source topics sender settings `s` replicate, split among `readers`: sender.topics
    (and sender.schemas.topic with sender.schemas: true) by name, sender.topics.regex by
    pattern, never sender.dead.letter.topic. What the readers discover and send, and what
    `diode resend` takes from a manifest (diode.resend), are both this."""
    named = [*s.topics, *([s.schemas_topic] if s.schemas else [])]
    exclude = {s.dead_letter_topic: "sender.dead.letter.topic: the sender's own dead letters, "
               "never replicated"} if s.dead_letter_topic else {}
    return TopicSelector(named, s.topics_regex, exclude, index, readers)


def partition_counts(client, timeout: float = 5.0) -> dict:
    """topic -> partition count, from any confluent_kafka client's metadata."""
    md = client.list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def create_topic(admin, topic: str, partitions: int, timeout: float = 15.0,
                 config: dict | None = None) -> bool:
    """Create `topic` with the cluster's default replication (and `config`: {name: value});
    False if it existed already. Clusters often refuse to create topics on a produce
    (auto.create.topics.enable=false), so every topic diode writes to is created on purpose.
    Other failures raise KafkaException."""
    created = create_topics(admin, {topic: (partitions, config)}, timeout)[topic]
    if isinstance(created, KafkaError):
        raise KafkaException(created)
    return created


# Partitions asked for in one CreateTopics request at most (Apache Kafka's controller refuses a
# request of more than 10 000, "excessively large"): more go in several requests.
CREATE_PARTITIONS_PER_REQUEST = 5000


def create_topics(admin, topics: dict, timeout: float = 15.0) -> dict:
    """Create `topics` ({topic: (partitions, config or None)}) with the cluster's default
    replication, in as few CreateTopics requests as the cluster takes (CREATE_PARTITIONS_PER_
    REQUEST partitions each), sent together and then waited for. Returns topic -> True
    (created), False (it existed already) or the KafkaError the cluster refused it with: a
    topic refused takes nothing from the others."""
    out: dict = {}
    futures: dict = {}
    batch: list = []
    size = 0
    for topic, (partitions, config) in topics.items():
        if batch and size + partitions > CREATE_PARTITIONS_PER_REQUEST:
            futures.update(admin.create_topics(batch, operation_timeout=timeout))
            batch, size = [], 0
        batch.append(NewTopic(topic, partitions,
                              config={k: str(v) for k, v in (config or {}).items()}))
        size += partitions
    if batch:
        futures.update(admin.create_topics(batch, operation_timeout=timeout))
    for topic, future in futures.items():
        try:
            future.result(timeout + 5)
            out[topic] = True
        except KafkaException as exc:
            error = exc.args[0]
            out[topic] = False if error.code() == KafkaError.TOPIC_ALREADY_EXISTS else error
        except TimeoutError:  # (concurrent.futures': the cluster did not answer in time)
            out[topic] = KafkaError(KafkaError._TIMED_OUT, f"creating {topic}: no answer")
    return out


def raise_partitions(admin, topic: str, partitions: int, timeout: float = 15.0) -> None:
    """Raise `topic`'s partition count to `partitions`; KafkaException when the cluster
    refuses (INVALID_PARTITIONS: it has that many already; Tansu: not supported)."""
    admin.create_partitions([NewPartitions(topic, partitions)],
                            operation_timeout=timeout)[topic].result(timeout + 5)


def produce_run(producer, topic: str, partition: int, run, keys: list, values: list,
                headers: list, start: int = 0) -> int:
    """Produce a run's records (diode.link.runs) from index `start` to `topic`, `partition` (-1:
    the partitioner's choice): `keys` and `values` as the run's key_list and value_list give
    them, `headers` as messages.provenance_headers makes them. Returns the index reached:
    short of the end when the producer's queue is full, and the next call resumes there (the
    columns are built once per run, not per attempt). The per-record work is the produce call
    alone: the kafka_writer's hot path, and what `diode check` measures."""
    produce = producer.produce
    done = start
    columns = (islice(c, start, None) for c in (values, keys, headers, run.timestamps))
    try:
        if run.types.count(0) == 0:  # every record has its timestamp: the common case
            for v, k, h, ts in zip(*columns):
                produce(topic, v, k, partition, timestamp=ts, headers=h)
                done += 1
        else:
            for v, k, h, ts, ty in zip(*columns, islice(run.types, start, None)):
                if ty:
                    produce(topic, v, k, partition, timestamp=ts, headers=h)
                else:
                    produce(topic, v, k, partition, headers=h)
                done += 1
    except BufferError:
        pass
    return done
