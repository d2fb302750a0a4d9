"""diode.runtime.launches.Launch, the one way the soak, `diode tune`, the bench, the figures
scripts and these tests run a `diode launch`: it is found once its supervisor registers, its
workers' metrics say what crossed, and it stops whole, drained or, if it does not stop in
time, killed, leaving no process behind."""

import signal

import psutil

from diode.runtime import launches
from tests.conftest import ROOT, consume, create_topic, produce, wait_for, write_topology

WORKERS = 6


def test_a_launch_is_found_read_restarted_and_stopped_with_nothing_left(tmp_path,
                                                                        start_brokers):
    src, dst = start_brokers("tansu", "source", "destination")
    path = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    create_topic(src.bootstrap, "src", 2)
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    d = launches.Launch(path, "both", run_dir, log, cwd=ROOT)
    with d:
        entry = d.wait_running()
        assert entry["pid"] == d.pid and entry["sides"] == ["sender", "receiver"]
        assert [e["pid"] for e in launches.running(str(path))] == [d.pid]
        d.wait_workers(WORKERS)
        d.wait_ready(WORKERS)
        produce(src.bootstrap, "src", [{"value": b"v%d" % i} for i in range(200)])
        assert len(consume(dst.bootstrap, "dst_src", 200)) == 200
        wait_for(lambda: sum(w["records"] for w in launches.worker_counters(
            run_dir, ("records",), "kafka_writer").values()) == 200, 30,
            "the writers' metrics to count 200 records")
        assert set(launches.worker_metrics(run_dir)) == set(d.workers())
        everything = d.ps.children(recursive=True)
        first = d.pid
    assert d.proc.returncode == 0, log.read_text()[-3000:]
    assert "draining" in log.read_text()
    _, alive = psutil.wait_procs(everything, timeout=5)
    assert alive == [] and launches.running(str(path)) == []

    # started again: ready only once this start's workers have written their metrics
    d.start()
    assert d.pid != first
    d.wait_ready(WORKERS)
    assert all(f.stat().st_mtime >= d.started
               for f in (run_dir / launches.METRICS_DIR).glob("*.prom"))
    produce(src.bootstrap, "src", [{"value": b"w%d" % i} for i in range(100)])
    assert len(consume(dst.bootstrap, "dst_src", 300)) == 300
    assert d.stop() == 0


def test_a_launch_that_does_not_stop_in_time_is_killed_whole(tmp_path, start_brokers):
    src, dst = start_brokers("tansu", "source", "destination")
    path = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    d = launches.Launch(path, "receiver", tmp_path / "run", tmp_path / "launch.log",
                        cwd=ROOT).start()
    try:
        d.wait_ready(3)
        everything = [d.ps, *d.ps.children(recursive=True)]
        d.ps.suspend()  # a supervisor that cannot act on SIGTERM
        assert d.stop(signal.SIGTERM, timeout=2) == -signal.SIGKILL
        _, alive = psutil.wait_procs(everything, timeout=5)
        assert alive == []
    finally:
        d.kill()
