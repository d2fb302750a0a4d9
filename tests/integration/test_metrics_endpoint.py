"""Operating diode like Kafka: each side's Prometheus endpoint serves every metric the docs and
the Grafana dashboard name, from a running pipeline; restarts show; `diode status` shows the
launch at a glance; a port already taken is a clear error."""

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from confluent_kafka import Consumer, TopicPartition

from diode.kafka.brokers import free_port
from diode.runtime.metrics import CATALOG, exported_name, samples
from tests.conftest import (ROOT, Launched, consume, create_topic, produce, wait_for,
                            write_topology)

WORKERS = 6


def scrape(listen: str) -> str:
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as r:
        return r.read().decode()


def names(text: str) -> set:
    """Metric names in Prometheus text, histogram series folded into their metric."""
    found = set()
    for name, _, _ in samples(text):
        folded = re.sub(r"_(bucket|sum|count)$", "", name)
        found.add(folded if folded in HISTOGRAMS else name)
    return found


HISTOGRAMS = {f"diode_{n}" for n, m in CATALOG.items() if m.kind == "histogram"}


NOT_METRICS = {"diode_kafka"}  # diode verify's Spark data source, named in verification.md


def named_in(text: str) -> set:
    return {re.sub(r"_(bucket|sum|count)$", "", n)
            for n in re.findall(r"\bdiode_[a-z_]+[a-z]", text)} - NOT_METRICS


def sample(text: str, name: str, **labels) -> float:
    """The sum of the samples named `name` (as exported) whose labels include `labels`."""
    return sum(value for full, found, value in samples(text) if full == name and
               all(found.get(k) == str(v) for k, v in labels.items()))


def test_each_side_serves_every_documented_metric_and_status_shows_the_launch(
        tmp_path, start_brokers):
    src, dst = start_brokers("tansu", "source", "destination")
    listen = {side: f"127.0.0.1:{free_port()}" for side in ("sender", "receiver")}
    path = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"metrics.listen": listen["sender"], "groups": ["app"]},
                          receiver={"metrics.listen": listen["receiver"],
                                    "missing.records.topic": "missing"})
    create_topic(src.bootstrap, "src", 2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    d = Launched(path, run_dir)
    try:
        d.wait_workers(WORKERS)
        d.wait_ready(WORKERS)
        produce(src.bootstrap, "src", [{"value": b"v%d" % i} for i in range(500)])
        assert len(consume(dst.bootstrap, "dst_src", 500)) == 500
        app = Consumer({"bootstrap.servers": src.bootstrap, "group.id": "app"})
        app.commit(offsets=[TopicPartition("src", p, 1) for p in (0, 1)],  # (a group's
                   asynchronous=False)                # offsets synced: the group's metric)
        app.close()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a forged datagram
            s.sendto(b"not a diode datagram" * 8, ("127.0.0.1", d_port(path)))
        deadline = time.monotonic() + 30
        while True:
            text = scrape(listen["sender"]) + scrape(listen["receiver"])
            if sample(text, "diode_records_total", stage="kafka_writer") == 500 and \
                    "diode_group_synced_timestamp_seconds{" in text and \
                    sample(text, "diode_rejects_total", reason="bad_magic") == 1 and \
                    sample(text, "diode_end_to_end_latency_seconds_count") >= 1:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        # latency is observed once the destination acknowledged: seconds, not the epoch
        assert 0 < sample(text, "diode_end_to_end_latency_seconds_sum") < 60 * sample(
            text, "diode_end_to_end_latency_seconds_count")
        served = names(text)
        catalog = {exported_name(n, m.kind) if m.kind != "histogram" else f"diode_{n}"
                   for n, m in CATALOG.items()}
        assert catalog <= served, catalog - served
        dashboard = (ROOT / "deploy" / "grafana" / "diode.json").read_text()
        documented = named_in(dashboard) | named_in(
            "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))) | named_in(
            (ROOT / "README.md").read_text())
        assert documented <= served, documented - served
        assert sample(text, "diode_worker_up", side="receiver") == 3
        # each side serves its own
        assert 'side="receiver"' not in scrape(listen["sender"])

        # a worker killed: its restart shows, its dead process's gauges go
        victim = d.workers()["receiver/unpacker-0"]
        victim.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while sample(scrape(listen["receiver"]), "diode_worker_restarts_total",
                     stage="unpacker") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.5)

        def dead_gauges_gone():
            text = scrape(listen["receiver"])
            return text if len([name for name, _, _ in samples(text)
                                if name == "diode_reassembly_bytes"]) == 1 else None
        text = wait_for(dead_gauges_gone, 30, "the dead unpacker's gauges to go")
        assert sample(text, "diode_sessions_active", stage="unpacker") <= 2  # not summed twice

        r = subprocess.run([sys.executable, "-m", "diode", "status", str(path), "--json"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        [status] = json.loads(r.stdout)
        assert status["sides"] == ["sender", "receiver"]
        assert {w["name"] for w in status["workers"]} == set(d.workers())
        assert all(w["state"] == "running" for w in status["workers"])
        assert next(w for w in status["workers"]
                    if w["name"] == "receiver/unpacker-0")["restarts"] == 1
        assert status["link"]["heartbeat_age_seconds"] < 5 and status["link"]["sessions"] >= 1
        assert status["link"]["rejected"] == 1
        table = subprocess.run([sys.executable, "-m", "diode", "status"], capture_output=True,
                               text=True, timeout=60, cwd=ROOT).stdout
        assert "receiver/kafka_writer-0" in table and "last heartbeat" in table
    finally:
        assert d.stop() == 0
    r = subprocess.run([sys.executable, "-m", "diode", "status", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1 and "no diode launch is running" in r.stderr


def d_port(path) -> int:
    from diode.runtime import topology
    return topology.load(path).link.port


def test_a_metrics_port_already_taken_is_a_clear_error(tmp_path, start_brokers):
    src, dst = start_brokers("tansu", "source", "destination")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                              receiver={"metrics.listen": f"127.0.0.1:{port}"})
        r = subprocess.run([sys.executable, "-m", "diode", "launch", str(path), "--side",
                            "receiver"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1
    assert f"receiver.metrics.listen 127.0.0.1:{port}" in r.stderr
    assert "Address already in use" in r.stderr


def burst(port: int, source: str, count: int) -> None:
    """`count` datagrams (not the diode's) to the receiver's port from `source`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((source, 0))
        for _ in range(count):
            s.sendto(b"x" * 1400, ("127.0.0.1", port))


def kernel_drops(port: int) -> int:
    """What the kernel dropped on every socket of `port` (the receiving socket and the
    counting one beside it: diode.link.admission)."""
    from diode.link import udpstat
    return sum(s["drops"] for s in udpstat.sockets()
               if int(s["local"].rsplit(":", 1)[1], 16) == port)


def test_a_restarted_udp_reader_exports_what_the_kernel_dropped_once(tmp_path, start_brokers,
                                                                     launch):
    """The receiving socket outlives a killed udp_reader, and so do the kernel's counts of what
    it dropped (a full buffer) and filtered (from an address not admitted): after a restart the
    endpoint serves each count as the kernel keeps it, not the dead reader's again on top
    (DiodeSocketDrops would fire for minutes after every restart), and with what the kernel
    dropped while no reader ran."""
    [dst] = start_brokers("tansu", "destination")
    listen = f"127.0.0.1:{free_port()}"
    path = write_topology(tmp_path, dst.bootstrap, dst.bootstrap,
                          link={"receive.buffer.bytes": 65536},
                          receiver={"metrics.listen": listen})
    port = d_port(path)
    d = launch(path, side="receiver", workers=3)
    reader = d.workers()["receiver/udp_reader-0"]

    reader.suspend()  # (it reads nothing: a burst fills its buffer, the rest is dropped)
    burst(port, "127.0.0.1", 1000)
    burst(port, "127.0.0.2", 300)   # filtered: never queued
    reader.resume()
    wait_for(lambda: d.metric("source_filtered_datagrams", "udp_reader") == 300 and
             d.metric("socket_drops", "udp_reader") > 0, 30, "the reader to export its drops")
    reader.suspend()  # dropped and filtered while the reader is stopped, then killed: its
    burst(port, "127.0.0.1", 1000)  # successor is the first to see these
    burst(port, "127.0.0.2", 200)
    reader.kill()
    killed = time.time()
    wait_for(lambda: d.metric("source_filtered_datagrams", "udp_reader") == 500 and any(
        f.stat().st_mtime > killed for f in (d.run_dir / "metrics").glob("*udp_reader*")),
        30, "the restarted reader to export")
    text = scrape(listen)
    drops = sample(text, "diode_socket_drops_total")
    filtered = sample(text, "diode_source_filtered_datagrams_total")
    kernel = kernel_drops(port)
    print(f"the kernel dropped {kernel - 500} and filtered 500; served: {drops:.0f} dropped, "
          f"{filtered:.0f} filtered")
    assert filtered == 500, text
    assert drops + filtered == kernel and drops > 1000, text
    assert d.stop() == 0
