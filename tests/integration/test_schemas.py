"""sender.schemas: the Schema Registry's topic across the diode, so that a registry on the low side
serves the same subjects, versions and ids, and every Avro record's schema id resolves there.

No real registry can be run here (docs/metadata.md, "Schemas"): tests/schema_registry.py
stands in, keeping its state only in the `_schemas` topic, in Confluent's record format, and
serving the REST API confluent_kafka's client, AvroSerializer and AvroDeserializer use."""

import json
import signal
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.conftest import consume, create_topic, produce, topics, wait_for, write_topology
from tests.schema_registry import NOOP_KEY, SchemaRegistry

SENDER, RECEIVER = 3, 3  # default worker processes per side

ORDER_V1 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"}]})
ORDER_V2 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "quantity", "type": "int", "default": 1}]})
USER = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": ["null", "int"]}]})
SCRATCH = json.dumps({"type": "record", "name": "Scratch", "fields": [
    {"name": "x", "type": "double"}]})
LATER = json.dumps({"type": "record", "name": "Later", "fields": [
    {"name": "at", "type": "long"}]})


@pytest.fixture
def registries():
    """start(bootstrap, **options): test registries, stopped at the end of the test."""
    started = []

    def start(bootstrap: str, **options) -> SchemaRegistry:
        r = SchemaRegistry(bootstrap, **options).start()
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def log_of(cluster: str, topic: str, timeout: float = 30, quiet: float = 0.5) -> list:
    """(key, value) of every record of `topic`'s one partition, in order, read to its end: the
    partition's end reached and nothing more for `quiet` seconds (Tansu reports an end before
    the last batch's records, docs/design.md §8)."""
    c = Consumer({"bootstrap.servers": cluster, "group.id": "schemas-test",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    out, end_at = [], None
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (end_at and
                                                   time.monotonic() - end_at >= quiet):
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error() is None:
                out.append((m.key(), m.value()))
                end_at = None
            else:
                end_at = end_at or time.monotonic()  # (the partition's end, as reported)
    finally:
        c.close()
    return out


def carried_whole(src: str, dst: str, topic: str = "_schemas", foreign=()) -> list:
    """Wait until the destination's `topic` holds what the source's holds, in order, and the
    (index, record) in `foreign` that others wrote there; the source's."""
    def same():
        theirs = log_of(src, topic)
        ours = log_of(dst, topic) if topic in topics(dst) else []
        expected = list(theirs)
        for index, record in foreign:
            expected.insert(index, record)
        return theirs if ours == expected else None
    return wait_for(same, 90, f"the destination's {topic} to hold the source's records")


def avro_records(client, topic: str, schema: str, values: list) -> list:
    """`values` serialized by AvroSerializer through `client` (registering `schema` under
    <topic>-value), as records for tests.conftest.produce."""
    serialize = AvroSerializer(client, schema)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [{"value": serialize(v, ctx), "key": b"%d" % i} for i, v in enumerate(values)]


def decoded(cluster: str, topic: str, client, source_topic: str, expected: int) -> list:
    """The destination `topic`'s records decoded by AvroDeserializer through `client` (the
    low side's registry), with the schema id each carries, in order."""
    deserialize = AvroDeserializer(client)
    ctx = SerializationContext(source_topic, MessageField.VALUE)
    got = sorted(consume(cluster, topic, expected, idle=1), key=lambda m: m.offset())
    return [(int.from_bytes(m.value()[1:5], "big"), deserialize(m.value(), ctx)) for m in got]


def served(client) -> dict:
    """What a registry serves: each subject's versions (soft-deleted ones too) with their ids
    and schemas, and the subjects not deleted."""
    out = {"subjects": sorted(client.get_subjects())}
    for subject in client.get_subjects(deleted=True):
        for version in client.get_versions(subject, deleted=True):
            r = client.get_version(subject, version, deleted=True)
            out[(subject, version)] = (r.schema_id, r.schema.schema_str)
    return out


def test_schemas_cross_whole_and_ids_resolve_on_the_low_side(tmp_path, start_brokers,
                                                              broker_kind, launch, registries):
    src, dst = start_brokers(broker_kind, "source", "destination")
    high = registries(src.bootstrap)
    hc = SchemaRegistryClient({"url": high.url})
    create_topic(src.bootstrap, "orders", 1)
    create_topic(src.bootstrap, "users", 1)
    # Two subjects and a second version of one: orders-value v1 is id 1, users-value v1 id 2,
    # orders-value v2 id 3 (ids follow the log, not the subjects).
    orders_v1 = [{"id": i, "item": f"item-{i}"} for i in range(20)]
    users = [{"name": f"user-{i}", "age": None if i % 3 else i} for i in range(15)]
    orders_v2 = [{"id": 100 + i, "item": f"item-{i}", "quantity": i} for i in range(20)]
    produce(src.bootstrap, "orders", avro_records(hc, "orders", ORDER_V1, orders_v1))
    produce(src.bootstrap, "users", avro_records(hc, "users", USER, users))
    produce(src.bootstrap, "orders", avro_records(hc, "orders", ORDER_V2, orders_v2))
    assert [hc.get_version("orders-value", 2).schema_id, hc.get_version(
        "users-value", 1).schema_id] == [3, 2]

    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"topics": ["orders", "users"], "schemas": True})
    d = launch(topo, workers=SENDER + RECEIVER)
    carried_whole(src.bootstrap, dst.bootstrap)
    # While it runs: a version soft-deleted, a NOOP, a subject registered, deleted and then
    # deleted for good (a tombstone): they follow, in order.
    hc.delete_version("orders-value", 1)
    high.noop()
    assert hc.register_schema("scratch-value", Schema(SCRATCH, "AVRO")) == 4
    hc.delete_subject("scratch-value")
    hc.delete_subject("scratch-value", permanent=True)
    log = carried_whole(src.bootstrap, dst.bootstrap)
    keys = [json.loads(k) for k, _ in log]
    assert [k["keytype"] for k in keys].count("NOOP") == 2  # the registry's own and ours
    assert log[-1] == (b'{"keytype":"SCHEMA","subject":"scratch-value","version":1,"magic":1}',
                       None)  # the hard delete's tombstone, carried as one
    assert ("DELETE_SUBJECT", "scratch-value") in [(k["keytype"], k.get("subject"))
                                                   for k in keys]
    # Created as a registry needs it: one partition, compacted (neither prefix nor rename).
    assert topics(dst.bootstrap)["_schemas"] == 1
    if broker_kind == "kafka":  # (Tansu does not describe topic configs)
        resource = ConfigResource("TOPIC", "_schemas")
        admin = AdminClient({"bootstrap.servers": dst.bootstrap})
        config = admin.describe_configs([resource])[resource].result(10)
        assert config["cleanup.policy"].value == "compact"

    # The low side's registry, built from the destination's _schemas alone, serves the same
    # subjects, versions and ids, and refuses registrations.
    low = registries(dst.bootstrap, read_only=True)
    lc = SchemaRegistryClient({"url": low.url})
    assert served(lc) == served(hc)
    assert served(lc)["subjects"] == ["orders-value", "users-value"]
    assert served(lc)[("orders-value", 2)][0] == 3
    with pytest.raises(SchemaRegistryError):
        lc.register_schema("orders-value", Schema(SCRATCH, "AVRO"))
    for schema_id in (1, 2, 3):  # (id 1's version is soft-deleted: still served by id)
        assert lc.get_schema(schema_id).schema_str == hc.get_schema(schema_id).schema_str

    # A Confluent registry on the low side writes a NOOP of its own when it starts. A
    # kafka_writer restarted after it finds where it stood all the same (the records with
    # its provenance headers) and writes what comes next once.
    produce(dst.bootstrap, "_schemas", [{"key": NOOP_KEY, "value": None}])
    writer = d.wait_workers(SENDER + RECEIVER)["receiver/kafka_writer-0"]
    writer.send_signal(signal.SIGKILL)
    wait_for(lambda: d.workers().get("receiver/kafka_writer-0", writer).pid != writer.pid, 30,
             "the kafka_writer to be restarted")
    assert hc.register_schema("later-value", Schema(LATER, "AVRO")) == 5
    carried_whole(src.bootstrap, dst.bootstrap, foreign=[(len(log), (NOOP_KEY, None))])
    assert wait_for(lambda: low.state.by_id(5), 30, "the low registry to read id 5")
    assert lc.get_version("later-value", 1).schema_id == 5

    # Every replicated Avro record's id resolves to its schema there, and decodes to what
    # was produced.
    assert decoded(dst.bootstrap, "dst_orders", lc, "orders", 40) == \
        [(1, v) for v in orders_v1] + [(3, v) for v in orders_v2]
    assert decoded(dst.bootstrap, "dst_users", lc, "users", 15) == [(2, v) for v in users]
    assert d.stop() == 0


def test_schemas_cross_whole_when_other_topics_start_at_their_end(tmp_path, start_brokers,
                                                                  broker_kind, launch,
                                                                  registries):
    """sender.start.position latest: the registry's topic is still read from its first
    record (its ids are assigned in its order), the other topics from their end."""
    src, dst = start_brokers(broker_kind, "source", "destination")
    high = registries(src.bootstrap)
    hc = SchemaRegistryClient({"url": high.url})
    create_topic(src.bootstrap, "orders", 1)
    before = [{"id": i, "item": "before"} for i in range(5)]
    for record in avro_records(hc, "orders", ORDER_V1, before):
        # (one batch each: Tansu's end is the last batch's first offset + 1, docs/design.md §8)
        produce(src.bootstrap, "orders", [record])
    hc.register_schema("users-value", Schema(USER, "AVRO"))

    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"topics": ["orders"], "schemas": True,
                                  "start.position": "latest"})
    launch(topo, workers=SENDER + RECEIVER)
    log = carried_whole(src.bootstrap, dst.bootstrap)
    assert len(log) == 3  # the registry's NOOP and both schemas, from the first record

    # orders starts at its end: what was there before is not carried, what comes is (a new
    # record each try, until one crosses: the reader's start at the end is not observable).
    lc = SchemaRegistryClient({"url": registries(dst.bootstrap, read_only=True).url})
    serialize = AvroSerializer(hc, ORDER_V1)
    ctx = SerializationContext("orders", MessageField.VALUE)
    after = []

    def crossed():
        after.append({"id": 1000 + len(after), "item": "after"})
        produce(src.bootstrap, "orders", [{"value": serialize(after[-1], ctx)}])
        return "dst_orders" in topics(dst.bootstrap) and \
            consume(dst.bootstrap, "dst_orders", 1, timeout=2)
    wait_for(crossed, 60, "a record produced after the launch to cross")
    got = [v for _, v in decoded(dst.bootstrap, "dst_orders", lc, "orders", 1)]
    assert got and all(v in after for v in got)  # none of the records from before
