"""The ACLs docs/security.md gives each side's principal are enough: an Apache Kafka broker with
an authorizer (nothing allowed but what an ACL allows) and SCRAM users, the ACLs made from the
page's kafka-acls.sh commands as printed, and both sides run with their own principal through
what needs each ACL: records read and committed, a record too large sent to the source's
dead-letter topic, destination topics created, written and their configs kept like the source's,
a consumer group's position translated and committed, the receiver restarted (the destination
and the missing-records topic read back) and its ticket listed by `diode tickets`. Nothing is
refused for authorization anywhere."""

import re
import shlex
import subprocess
import sys

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ResourcePatternType, ResourceType)

from tests.conftest import (ROOT, committed_offsets, consume, create_topic, produce, wait_for,
                            write_topology)

SECURITY = ROOT / "docs" / "security.md"
USERS = {"admin": "admin-secret", "diode-high": "high-secret", "diode-low": "low-secret"}


def acl_commands() -> list:
    """The argv of every kafka-acls.sh command of docs/security.md (continuations joined)."""
    text = SECURITY.read_text().replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines()
            if line.startswith("kafka-acls.sh ")]


def bindings(argv: list) -> list:
    """The ACL bindings kafka-acls.sh --add makes of these arguments."""
    ops, resources, principal, pattern = [], [], None, ResourcePatternType.LITERAL
    i = 1
    while i < len(argv):
        option, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if option == "--operation":
            ops.append(AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", value).upper()])
        elif option == "--allow-principal":
            principal = value
        elif option == "--resource-pattern-type":
            pattern = ResourcePatternType[value.upper()]
        elif option in ("--topic", "--group"):
            resources.append((ResourceType[option[2:].upper()], value))
        elif option == "--cluster":
            resources.append((ResourceType.BROKER, "kafka-cluster"))
            i -= 1
        elif option == "--add":
            i -= 1
        i += 2
    assert principal and ops and resources, argv
    return [AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW)
            for kind, name in resources for op in ops]


def test_the_acls_of_the_docs_are_all_each_side_needs(start_brokers, tmp_path, launch,
                                                      monkeypatch):
    [broker] = start_brokers("kafka", "cluster", users=USERS, config={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        # the broker's own listeners (inter-broker, controller) are plaintext: ANONYMOUS
        "super.users": "User:admin;User:ANONYMOUS"})
    admin_conf = broker.client_config("admin")
    admin = AdminClient(admin_conf)
    made = [b for argv in acl_commands() for b in bindings(argv)]
    assert {b.principal for b in made} == {"User:diode-high", "User:diode-low"}
    for future in admin.create_acls(made).values():
        future.result(30)
    # The source's topics and a consumer group's position, made by an administrator; the same
    # cluster is both sides' (each side's principal has only its own ACLs)
    create_topic(admin_conf, "orders", 2)
    create_topic(admin_conf, "telemetry", 1)
    produce(admin_conf, "orders", [{"value": b"order %d" % i, "partition": i % 2}
                                   for i in range(40)])
    produce(admin_conf, "telemetry", [{"value": b"t" * 300_000}, {"value": b"small"}])
    app = Consumer({**admin_conf, "group.id": "app-1", "enable.auto.commit": False})

    def committed():
        try:  # (NOT_COORDINATOR while a broker just started loads its offsets topic)
            return app.commit(offsets=[TopicPartition("orders", 0, 10)], asynchronous=False)
        except KafkaException:
            return None
    wait_for(committed, 30, "app-1's commit on the source")
    app.close()
    for user in ("diode-high", "diode-low"):
        monkeypatch.setenv(f"PW_{user[6:].upper()}", USERS[user])

    def sasl(user):
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": user, "sasl.password": f"${{env:PW_{user[6:].upper()}}}"}
    topology = write_topology(
        tmp_path, broker.bootstrap, broker.bootstrap, name="plant1",
        sender={"kafka": sasl("diode-high"), "topics": ["orders", "telemetry"],
                "groups": ["app-.*"], "max.record.bytes": 200_000,
                "metadata.interval.ms": 1000},
        receiver={"kafka": sasl("diode-low"), "topic.prefix": "high.",
                  "missing.records.topic": "diode-missing",
                  "heartbeat.topic": "diode-heartbeats", "digest.topic": "diode-digests",
                  "dead.letter.topic": "diode-dead-letter-low"})
    receiver = launch(topology, side="receiver", workers=3)
    sender = launch(topology, side="sender", workers=3)
    # read, sent, written to topics the receiver creates; the big one to the source's DLQ
    assert len(consume(admin_conf, "high.orders", 40, timeout=60)) == 40
    assert [m.value() for m in consume(admin_conf, "high.telemetry", 1, timeout=30)] == \
        [b"small"]
    [dead] = consume(admin_conf, "diode-dead-letter", 1, timeout=30)
    assert b"exceeds sender.max.record.bytes" in dict(dead.headers())["diodeError"]
    # a config changed on the source is changed on the destination topic, made before
    retention = ConfigResource(ResourceType.TOPIC, "orders", incremental_configs=[
        ConfigEntry("retention.ms", "172800000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([retention])[retention].result(30)

    def retention_ms():
        r = ConfigResource(ResourceType.TOPIC, "high.orders")
        return admin.describe_configs([r])[r].result(30)["retention.ms"].value
    wait_for(lambda: retention_ms() == "172800000", 60, "retention.ms synced")
    # the group's position translated and committed on the destination
    wait_for(lambda: committed_offsets(admin_conf, "app-1", "high.orders", 2,
                                       timeout=1)[0] >= 0, 60, "app-1 on high.orders")
    # a receiver restart: what it missed reported, listed, resent, filled
    assert receiver.stop() == 0
    produce(admin_conf, "orders", [{"value": b"while down %d" % i, "partition": 0}
                                   for i in range(5)])
    wait_for(lambda: sender.metric("records", "udp_sender") >= 45, 30, "the five sent")
    receiver.start()
    wait_for(lambda: receiver.metric("missing_records", "kafka_writer") >= 5, 60,
             "the five reported, after the destination was read back")
    r = subprocess.run([sys.executable, "-m", "diode", "tickets", str(topology), "--open"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "receiver-down" in r.stdout, r.stdout + r.stderr
    said = sender.output() + receiver.output()
    refused = [line for line in said.splitlines()
               if re.search(r"authori[sz]ation|not authorized", line, re.I)]
    assert not refused, "\n".join(refused[:20])
