"""`diode resend` sends a manifest's ranges only from the incarnation the manifest names
(docs/verification.md): after the topic was recreated, the same offsets hold other records, and
a manifest made for the old topic is refused with nothing sent. Runs on Apache Kafka and on
Tansu, against the real source broker; the link's UDP port is watched for what is sent. Its dry
run says what would be sent and sends nothing; it runs beside the running sender and its
metrics exporter (on Tansu: neither depends on the broker)."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import yaml

from diode import ticket_command
from diode.kafka.brokers import free_port
from diode.runtime import topology as topo
from tests.conftest import (ROOT, consume, create_topic, produce, recreate, source_coordinates,
                            topic_id, write_topology)

PARTITIONS = 2


def signed(topology, manifest: dict) -> dict:
    """The manifest as `diode tickets --manifest` writes it: signed with the link's key."""
    return ticket_command.signed(topo.load(str(topology)), manifest)


def resend(tmp_path, topology, manifest: dict, *extra) -> subprocess.CompletedProcess:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(signed(topology, manifest)))
    return subprocess.run([sys.executable, "-m", "diode", "resend", str(path), "--topology",
                           str(topology), "--run-dir", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def datagrams(link: socket.socket, wait: float) -> int:
    """How many datagrams came to the link's port, waiting up to `wait` s for more."""
    n, deadline = 0, time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            link.recv(65536)
            n += 1
        except BlockingIOError:
            time.sleep(0.05)
    return n


def test_a_manifest_of_another_incarnation_is_refused_and_nothing_sent(tmp_path, start_brokers,
                                                                       broker_kind):
    src, = start_brokers(broker_kind, "source")
    create_topic(src.bootstrap, "src", PARTITIONS)
    old = topic_id(src.bootstrap, "src")
    new = recreate(src.bootstrap, "src", PARTITIONS)
    assert old != new
    produce(src.bootstrap, "src", [{"value": b"%d" % i, "partition": i % PARTITIONS}
                                   for i in range(10)])
    topology = write_topology(tmp_path, src.bootstrap, "127.0.0.1:9")  # (sender side only)
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", yaml.safe_load(topology.read_text())["link"]["port"]))
    link.setblocking(False)
    try:
        # made by diode verify before the recreation: offsets 0..2 now hold other records
        stale = {"version": 1, "missing": [{"topic": "src", "partition": p, "topicId": old,
                                            "ranges": [[0, 2]]} for p in range(PARTITIONS)]}
        r = resend(tmp_path, topology, stale)
        assert r.returncode == 1, r.stderr[-3000:]
        assert "nothing resent" in r.stderr and "not resent" in r.stderr
        assert f"src partition(s) 0, 1: the manifest names topic id {old}, the source " \
            f"cluster's src is topic id {new}" in r.stderr, r.stderr[-3000:]
        assert "resending" not in r.stderr  # no sender started
        assert datagrams(link, 1.0) == 0
        # the current incarnation's ranges are sent; ranges without a topic id (a manifest
        # of an older diode) or with the all-zero one too, with a warning that they could not
        # be checked. librdkafka's own text of the id (+ and /) names the same incarnation.
        current = {"version": 1, "missing": [
            {"topic": "src", "partition": 0, "ranges": [[0, 2]],
             "topicId": new.replace("-", "+").replace("_", "/")},
            {"topic": "src", "partition": 1, "ranges": [[0, 1]]},
            {"topic": "src", "partition": 1, "ranges": [[2, 2]], "topicId": "A" * 22}]}
        r = resend(tmp_path, topology, current)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "resend complete" in r.stderr
        assert "resending ranges of src unchecked" in r.stderr
        assert datagrams(link, 0.5) > 0
        # a manifest naming both: the current incarnation's sent, the old one's refused (exit
        # 1); a range ending at the partition's last record (4) ends the resend there too
        mixed = {"version": 1, "missing": [
            {"topic": "src", "partition": 0, "topicId": new, "ranges": [[3, 4]]},
            {"topic": "src", "partition": 1, "topicId": old, "ranges": [[0, 2]]}]}
        r = resend(tmp_path, topology, mixed)
        assert r.returncode == 1, r.stderr[-3000:]
        assert f"src partition(s) 1: the manifest names topic id {old}" in r.stderr
        assert "resend complete" in r.stderr
    finally:
        link.close()


def test_a_manifest_naming_no_topic_id_form_is_not_a_manifest(tmp_path):
    path = tmp_path / "manifest.json"
    topology = write_topology(tmp_path, "127.0.0.1:9", "127.0.0.1:9")
    path.write_text(json.dumps(signed(topology, {"version": 1, "missing": [
        {"topic": "src", "partition": 0, "topicId": "not an id", "ranges": [[0, 2]]}]})))
    r = subprocess.run([sys.executable, "-m", "diode", "resend", str(path), "--topology",
                        str(topology)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1
    assert "is not a resend manifest: topicId 'not an id' is not a topic id" in r.stderr


def test_a_dry_run_sends_nothing_and_a_resend_runs_beside_the_sender_and_its_exporter(
        tmp_path, start_brokers, launch):
    """The dry run reads the source and prints each range with the records it holds now,
    sending nothing (no datagram at the link's port, and the metrics port, held here, is not
    needed); exit 1 while a range lies past its partition's end, 0 when all would be sent. A
    manifest naming a topic the sender does not replicate is refused (exit 1). Then, beside the
    running launch whose sender's exporter holds sender.metrics.listen, the resend runs (no
    exporter of its own) and its records cross: each once more at the destination."""
    src, dst = start_brokers("tansu", "source", "destination")
    create_topic(src.bootstrap, "src", PARTITIONS)
    produce(src.bootstrap, "src", [{"value": b"%d" % i, "partition": i % PARTITIONS}
                                   for i in range(20)])  # offsets 0..9 in each partition
    listen = f"127.0.0.1:{free_port()}"
    topology = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                              sender={"metrics.listen": listen})
    tid = topic_id(src.bootstrap, "src")
    wide = {"version": 1, "missing": [
        {"topic": "src", "partition": 0, "topicId": tid, "ranges": [[0, 4], [8, 14]]},
        {"topic": "src", "partition": 1, "topicId": tid, "ranges": [[2, 3]]}]}
    held = json.loads(json.dumps(wide))
    held["missing"][0]["ranges"][1] = [8, 9]
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", yaml.safe_load(topology.read_text())["link"]["port"]))
    link.setblocking(False)
    metrics = socket.create_server(("127.0.0.1", int(listen.rsplit(":", 1)[1])))
    try:
        r = resend(tmp_path, topology, wide, "--dry-run")
        assert r.returncode == 1, r.stderr[-3000:]
        assert r.stdout.splitlines() == [
            "dry run: nothing is sent",
            f"{'source':<28} {'topic id':<22} {'offsets':<23} {'records':>8}  note",
            f"{'src[0]':<28} {tid:<22} {'0..4':<23} {5:>8}",
            f"{'src[0]':<28} {tid:<22} {'8..14':<23} {2:>8}  offsets 10..14 past the "
            "partition's end: never written",
            f"{'src[1]':<28} {tid:<22} {'2..3':<23} {2:>8}",
            "would send 9 record(s) of 3 range(s) in 2 partition(s); not sent: 0 offset(s) "
            "expired, 5 past an end, 0 refusal(s)"], r.stdout
        r = resend(tmp_path, topology, held, "--dry-run")
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.splitlines()[-1].startswith("would send 9 record(s) of 3 range(s)")
        other = {"version": 1, "missing": [*held["missing"], {
            "topic": "secret", "partition": 0, "ranges": [[0, 9]]}]}
        r = resend(tmp_path, topology, other, "--dry-run")
        assert r.returncode == 1 and "secret is not a topic the sender replicates" in r.stderr
        assert not r.stdout
        assert datagrams(link, 0.5) == 0
    finally:
        link.close()
        metrics.close()

    d = launch(topology, workers=6)
    assert len(consume(dst.bootstrap, "dst_src", 20)) == 20
    scrape = f"http://{listen}/metrics"
    assert b"diode_worker_up" in urllib.request.urlopen(scrape, timeout=10).read()
    r = resend(tmp_path, topology, held)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resend complete" in r.stderr and "metrics" not in r.stderr, r.stderr[-3000:]
    got = Counter(source_coordinates(consume(dst.bootstrap, "dst_src", 29, timeout=30)))
    assert sorted(c for c, n in got.items() if n == 2) == [
        ("src", 0, o) for o in (0, 1, 2, 3, 4, 8, 9)] + [("src", 1, 2), ("src", 1, 3)]
    assert sum(got.values()) == 29  # (each record once, the resent ones twice)
    assert d.alive()
    assert b"diode_worker_up" in urllib.request.urlopen(scrape, timeout=10).read()
