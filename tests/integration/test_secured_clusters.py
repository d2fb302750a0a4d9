"""Every command that talks to a cluster takes its client settings the same way
(diode.kafka.cluster, docs/clients.md): `--topology FILE` (a side's kafka section, its secrets
read as the launch reads them) or `-X KEY=VALUE` (produce, consume, verify, tickets, resend), against an Apache Kafka broker whose only
client listener is SASL/SCRAM over TLS, with a certificate of a CA the test makes. Both
clusters are that broker (the source topic and the destination's beside it): one JVM."""

import json
import subprocess
import sys
import time

from diode.kafka.brokers import tls_certificates
from diode.kafka.cluster import CONNECT_TIMEOUT_SECONDS
from tests.conftest import ROOT, listening, wait_for, write_topology

PASSWORD = "scram-secret-7"
DEMO = ["silicon", "resistor", "transistor", "capacitor", "amplifier"]  # ./scripts/demo's


def diode(*argv, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """`diode ARGV` as a process, and how long it took."""
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "diode", *map(str, argv)], capture_output=True,
                       text=True, cwd=ROOT, timeout=timeout)
    return r, time.monotonic() - started


def test_every_command_reads_and_writes_a_sasl_ssl_cluster_with_the_topology_or_x_settings(
        tmp_path, start_brokers, launch, verify_here, monkeypatch):
    broker, = start_brokers("kafka", "secured", users={"diode": PASSWORD}, tls=True)
    (tmp_path / "kafka.password").write_text(PASSWORD + "\n")
    (tmp_path / "kafka.password").chmod(0o600)
    monkeypatch.setenv("DIODE_TEST_KAFKA_PASSWORD", PASSWORD)
    secured = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
               "sasl.username": "diode", "ssl.ca.location": broker.ca_file}
    topology = write_topology(
        tmp_path, broker.bootstrap, broker.bootstrap,
        sender={"kafka": {**secured, "sasl.password": "${file:kafka.password}"},
                "topics": ["diode"], "heartbeat.interval.ms": 300},
        receiver={"kafka": {**secured, "sasl.password": "${env:DIODE_TEST_KAFKA_PASSWORD}"},
                  "topic.prefix": "dest_", "missing.records.topic": "diode-missing",
                  "reorder.wait.ms": 300})
    x = [a for k, v in {**secured, "sasl.password": "${env:DIODE_TEST_KAFKA_PASSWORD}"}.items()
         for a in ("-X", f"{k}={v}")]
    said = []  # every output, none of which may hold the password

    def run(*argv, expect: int = 0) -> tuple[str, float]:
        r, took = diode(*argv)
        said.append(r.stdout + r.stderr)
        assert r.returncode == expect, (argv, r.stdout, r.stderr)
        return r.stdout + r.stderr, took

    # the demo's records, to the source side's cluster of the topology (the default --side)
    run("produce", "--topology", topology, "--topic", "diode", "--partitions", "1", *DEMO)
    receiver = listening(launch(topology, side="receiver"))  # (what is sent before is not heard)
    sender = launch(topology, side="sender")
    wait_for(lambda: receiver.metric("records", "kafka_writer") == 5, 90, "the demo's records")
    # three more while the receiver is down (-X, as kcat takes them): a missing range, a ticket
    assert receiver.stop() == 0
    run("produce", "--bootstrap", broker.bootstrap, *x, "--topic", "diode", "lost", "on", "link")
    wait_for(lambda: sender.metric("records", "kafka_reader") == 8, 30, "the three sent")
    receiver = launch(topology, side="receiver")
    wait_for(lambda: receiver.output().count("listening on udp") == 2, 60,
             "the receiver reading again")
    run("produce", "--topology", topology, "--topic", "diode", "after")

    def opened():
        r, _ = diode("tickets", topology, "--open", "--json")
        return r.returncode == 0 and json.loads(r.stdout)
    tickets = wait_for(opened, 60, "the ticket of the records sent while the receiver was down")
    assert [(t["topic"], t["partition"], t["first"], t["last"]) for t in tickets] == \
        [("diode", 0, 5, 7)], tickets
    # its manifest, carried to the high side: what a resend would send, read from the secured
    # source with the topology's settings; a wrong password there is the same clear error
    manifest = tmp_path / "manifest.json"
    run("tickets", topology, "--manifest", manifest)
    out, _ = run("resend", manifest, "--topology", topology, "--dry-run")
    assert "would send 3 record(s) of 1 range(s) in 1 partition(s)" in out, out
    out, took = run("resend", manifest, "--topology", topology, "--dry-run",
                    "-X", "sasl.password=not-the-password", expect=2)
    assert "authentication failed for sasl.username=diode (SCRAM-SHA-256 over SASL_SSL): " \
        "check sasl.password (given with -X)" in out, out
    assert took < CONNECT_TIMEOUT_SECONDS, took
    out, _ = run("consume", "--topology", topology, "--topic", "dest_diode", "--count", "6",
                 "--timeout", "30")
    assert [line.split()[1] for line in out.splitlines() if line.startswith("dest_diode")] == \
        [*DEMO, "after"], out
    assert "sourceOffset=8 " in out
    out, _ = run("consume", "--bootstrap", broker.bootstrap, *x, "--topic", "diode-missing",
                 "--count", "1", "--timeout", "30")
    event = json.loads(out.splitlines()[0].split(" ", 1)[1].rsplit("  ", 1)[0])
    assert (event["type"], event["firstOffset"], event["lastOffset"]) == ("missing", 5, 7), out
    out, _ = run("-v", "consume", "--topology", topology, "--side", "sender", "--topic", "diode",
                 "--count", "9", "--timeout", "30")
    assert "sasl.password=(${file:kafka.password} in sender.kafka of" in out, out

    # the audit, with Spark's Kafka connector (the topology's settings in the Java client's
    # terms) and with diode's Python source (-X), against the source too
    r = verify_here("--topology", topology, "--prefix", "dest_", "--format", "native")
    said.append(r.stdout + r.stderr)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "reading the destination with the kafka source" in r.stderr
    assert "total: 6 records, 6 distinct, 0 duplicates, 3 missing" in r.stdout, r.stdout
    assert "5..7" in r.stdout
    r = verify_here("--bootstrap", broker.bootstrap, *x, "--prefix", "dest_", "--format",
                    "python", "--source-topology", topology)
    said.append(r.stdout + r.stderr)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "reading the source with the diode_kafka source" in r.stderr
    assert "against the source: 3 lost, 0 duplicated, 0 altered" in r.stdout, r.stdout

    # a wrong password: a clear error naming the setting, at once (exit 2), for each command
    wrong = [*x[:-1], "sasl.password=not-the-password"]
    for argv in (["produce", "--bootstrap", broker.bootstrap, *wrong, "--topic", "diode", "x"],
                 ["consume", "--bootstrap", broker.bootstrap, *wrong, "--topic", "diode"]):
        out, took = run(*argv, expect=2)
        assert "authentication failed for sasl.username=diode (SCRAM-SHA-256 over SASL_SSL): " \
            "check sasl.password (given with -X)" in out, out
        assert took < CONNECT_TIMEOUT_SECONDS, took  # (not waited out: refused at once)
        assert "not-the-password" not in out
    # a certificate authority the client does not trust: the setting to check, at once too
    (tmp_path / "other-ca.pem").write_bytes(tls_certificates("127.0.0.1", b"x")[0])
    out, took = run("consume", "--bootstrap", broker.bootstrap, *x, "-X",
                    f"ssl.ca.location={tmp_path / 'other-ca.pem'}", "--topic", "diode",
                    expect=2)
    assert "the broker's TLS certificate is not trusted" in out and \
        f"check ssl.ca.location ({tmp_path / 'other-ca.pem'} given with -X)" in out, out
    assert took < CONNECT_TIMEOUT_SECONDS, took
    monkeypatch.setenv("DIODE_TEST_KAFKA_PASSWORD", "not-the-password")
    started = time.monotonic()
    r = verify_here("--topology", topology, "--prefix", "dest_")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "authentication failed for sasl.username=diode" in r.stderr and \
        "check sasl.password (${env:DIODE_TEST_KAFKA_PASSWORD} in receiver.kafka of" in \
        r.stderr, r.stderr
    assert time.monotonic() - started < CONNECT_TIMEOUT_SECONDS
    out, _ = run("tickets", topology, expect=2)
    assert "check sasl.password" in out and "not-the-password" not in out
    assert not [text for text in said if PASSWORD in text]
