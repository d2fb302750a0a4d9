"""diode.runtime.launches: the workers' metrics files read back as the workers wrote them, and
a launch that fails at start said so with its log, a running one found however it can be
read."""

import os
import time
from pathlib import Path

import pytest

from diode.errors import DiodeError
from diode.runtime import launches
from diode.runtime.metrics import Metrics
from tests.conftest import posing_as_launch


def worker(run_dir, side: str, stage: str, index: int) -> Metrics:
    """A worker's metrics, written where diode.runtime.worker writes them."""
    m = Metrics({"side": side, "stage": stage, "index": index},
                f"{run_dir}/metrics/{side}-{stage}-{index}.prom")
    return m


def test_each_worker_s_file_is_read_by_its_name_and_stage(tmp_path):
    writers = [worker(tmp_path, "receiver", "kafka_writer", i) for i in (0, 1)]
    writers[0].inc("records", 30, topic="a")
    writers[0].inc("records", 12, topic="b")
    writers[1].inc("records", 5, topic="a")
    unpacker = worker(tmp_path, "receiver", "unpacker", 0)
    unpacker.inc("datagrams", 7)
    for m in (*writers, unpacker):
        m.maybe_write(force=True)
    (tmp_path / "metrics" / "receiver-udp_reader-0.prom.new").write_text("half")  # a crash's

    texts = launches.worker_metrics(tmp_path)
    assert list(texts) == ["receiver/kafka_writer-0", "receiver/kafka_writer-1",
                           "receiver/unpacker-0"]
    assert list(launches.worker_metrics(tmp_path, "kafka_writer")) == [
        "receiver/kafka_writer-0", "receiver/kafka_writer-1"]
    counted = launches.worker_counters(tmp_path, ("records", "datagrams"), "kafka_writer")
    assert counted == {"receiver/kafka_writer-0": {"records": 42, "datagrams": 0},
                       "receiver/kafka_writer-1": {"records": 5, "datagrams": 0}}
    assert launches.worker_counters(tmp_path, ("datagrams",))["receiver/unpacker-0"] == {
        "datagrams": 7}
    assert launches.split_name("receiver/kafka_writer-1") == ("receiver", "kafka_writer", 1)


def test_since_leaves_out_what_an_earlier_start_left(tmp_path):
    old, new = worker(tmp_path, "sender", "packer", 0), worker(tmp_path, "sender", "packer", 1)
    old.maybe_write(force=True)
    hour_ago = time.time() - 3600
    os.utime(old.path, (hour_ago, hour_ago))
    started = time.time() - 1
    new.maybe_write(force=True)
    assert list(launches.worker_metrics(tmp_path, since=started)) == ["sender/packer-1"]
    assert len(launches.worker_metrics(tmp_path)) == 2


def test_no_metrics_directory_is_no_workers(tmp_path):
    assert launches.worker_metrics(tmp_path) == {}
    assert launches.worker_counters(tmp_path / "absent", ("records",)) == {}


def test_a_launch_that_exits_at_start_says_so_with_its_log(tmp_path):
    bad = tmp_path / "topology.yaml"
    bad.write_text("name: broken\nlink: {port: not-a-port}\n")
    log = tmp_path / "launch.log"
    with launches.Launch(bad, "receiver", tmp_path / "run", log) as d:
        with pytest.raises(DiodeError) as raised:
            d.wait_running(timeout=60)
        assert d.proc.returncode not in (0, None)
    said = str(raised.value)
    assert "exited with" in said and "registered" in said and str(log) in said
    assert "link.port" in log.read_text()  # the reason is in its log
    assert d.stop() == d.proc.returncode  # stopping what has stopped: its exit code


def test_a_launch_whose_run_dir_cannot_be_read_is_found_with_why(tmp_path, monkeypatch):
    """Another user's launch (its run directory 0750): found by its title, with what the title
    says and why no more."""
    topology, run_dir = tmp_path / "plant1.yaml", tmp_path / "receiver-plant1"
    with posing_as_launch(topology, ("receiver",), run_dir):
        status_file = run_dir / launches.STATUS_FILE
        read = Path.read_text

        def refused(path, *args, **kwargs):
            if path == status_file:
                raise PermissionError(13, "Permission denied", str(path))
            return read(path, *args, **kwargs)
        monkeypatch.setattr(Path, "read_text", refused)
        entry, = launches.running(str(topology))
    assert (entry["pid"], entry["sides"], entry["run_dir"], entry["topology"]) == (
        os.getpid(), ["receiver"], str(run_dir), str(topology))
    assert entry["unreadable"] == f"Permission denied: {status_file}"
