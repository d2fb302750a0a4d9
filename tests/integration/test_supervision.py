"""The supervisor's worker states in a real launch: a normal start is STARTING then RUNNING; a
stage whose open() fails is a failed start, tried again, then FATAL, and the launch stops
saying why."""

import json
import re
import signal
import subprocess
import sys

import psutil

from tests.conftest import ROOT, wait_for, write_topology

RECEIVER = ("receiver/udp_reader-0", "receiver/unpacker-0", "receiver/kafka_writer-0")


def transitions(output: str, worker: str) -> list[str]:
    """The state changes the supervisor logged for `worker`, in order."""
    return re.findall(rf"{re.escape(worker)}: ([A-Z]+ -> [A-Z]+)", output)


def test_a_stage_that_cannot_open_fails_to_start_and_the_launch_stops_saying_why(tmp_path,
                                                                                   launch):
    """The writer's destination needs TLS and its CA file is not there: librdkafka refuses to
    make the producer in the writer's open()."""
    missing = tmp_path / "no-such-ca.pem"
    topo = write_topology(
        tmp_path, "127.0.0.1:1", "127.0.0.1:2",
        receiver={"kafka": {"bootstrap.servers": "127.0.0.1:2", "security.protocol": "ssl",
                            "ssl.ca.location": str(missing)}},
        supervisor={"start.retries": 1, "start.backoff.ms": 100, "drain.timeout.seconds": 2})
    d = launch(topo, side="receiver")
    assert d.proc.wait(60) == 1
    out = d.output()
    assert transitions(out, "receiver/kafka_writer-0") == [
        "STOPPED -> STARTING", "STARTING -> BACKOFF", "BACKOFF -> STARTING",
        "STARTING -> BACKOFF", "BACKOFF -> FATAL"]
    # the worker's own line, and the supervisor's when it gives up, name the cause
    assert "receiver/kafka_writer-0" in out and "failed to start:" in out
    [gave_up] = [line for line in out.splitlines() if "giving up" in line]
    assert "receiver/kafka_writer-0 failed to start 2 times in a row (supervisor.start.retries " \
           "1), the last: KafkaException:" in gave_up
    assert "ssl.ca.location failed" in gave_up and "(exit code 1)" in gave_up
    # the others were started, and drained; no worker is left
    for name in RECEIVER[:2]:
        trail = transitions(out, name)
        assert trail[0] == "STOPPED -> STARTING" and trail[-1] == "STOPPING -> STOPPED"
        assert trail[-2] in ("RUNNING -> STOPPING", "STARTING -> STOPPING")
    assert not [pid for pid in re.findall(r"-> STARTING \(pid (\d+)\)", out)
                if psutil.pid_exists(int(pid))]


def test_a_normal_start_is_starting_then_running(tmp_path, start_brokers, launch):
    [destination] = start_brokers("tansu", "destination")
    topo = write_topology(tmp_path, "127.0.0.1:1", destination.bootstrap)
    d = launch(topo, side="receiver", workers=3)
    wait_for(lambda: all("STARTING -> RUNNING" in transitions(d.output(), name)
                         for name in RECEIVER), 30, "every worker running")
    for name in RECEIVER:
        assert transitions(d.output(), name) == ["STOPPED -> STARTING", "STARTING -> RUNNING"]

    def status():
        r = subprocess.run([sys.executable, "-m", "diode", "status", str(topo), "--json"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        [launched] = json.loads(r.stdout)
        return launched

    # (the status file is rewritten each second)
    launched = wait_for(lambda: all(w["state"] == "running" for w in status()["workers"])
                        and status(), 30, "diode status to show every worker running")
    assert {w["name"]: w["message"] for w in launched["workers"]} == dict.fromkeys(RECEIVER, "")
    assert d.stop(signal.SIGTERM) == 0
    for name in RECEIVER:
        assert transitions(d.output(), name)[2:] == ["RUNNING -> STOPPING",
                                                     "STOPPING -> STOPPED"]
