"""diode.runtime.metrics: Prometheus text that operators, `diode status` and tests read back."""

import re

import pytest

from diode.runtime.metrics import Metrics, read_counter

SAMPLE = re.compile(r'^diode_[a-z_]+\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)?\} \S+$')


def sample_metrics():
    m = Metrics({"side": "receiver", "stage": "unpacker", "index": "0"})
    m.inc("datagrams")
    m.inc("datagrams", 4)
    m.inc("rejects", reason="auth_failed")
    m.inc("rejects", 2, reason="bad_magic")
    m.inc("records", 7, topic="orders", partition="1")
    m.set("queue_depth", 12)
    return m


def test_text_is_prometheus_exposition_format():
    text = sample_metrics().text()
    assert text.endswith("\n")
    lines = text.splitlines()
    # Prometheus conventions: counters end in _total
    assert "# TYPE diode_datagrams_total counter" in lines
    assert "# TYPE diode_rejects_total counter" in lines
    assert "# TYPE diode_queue_depth gauge" in lines
    for line in lines:
        assert line.startswith("# TYPE ") or SAMPLE.match(line), line
    # each TYPE line precedes its samples, and is given once per metric
    types = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(types) == len(set(types))
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            name = line.split("{")[0]
            declared = [j for j, t in enumerate(lines) if t.startswith(f"# TYPE {name} ")]
            assert declared and declared[0] < i


def test_the_text_written_again_shows_every_value_and_series_as_they_are_now():
    """Each series' name and labels are rendered once and kept (thousands of per-topic series
    every second): a later text shows each value as it is then, series added since in their
    place, and one gone no more."""
    m = Metrics({"side": "receiver", "stage": "kafka_writer"})
    m.set("source_lag_records", 5, topic="b")
    m.inc("rejects", 2, reason="replayed")
    m.text()
    m.set("source_lag_records", 7, topic="b")
    m.set("source_lag_records", 1, topic="a")
    m.inc("rejects", reason="replayed")
    m.set("bytes_in_flight", 3)
    text = m.text()
    lag = [line for line in text.splitlines() if line.startswith("diode_source_lag_records{")]
    assert lag == ['diode_source_lag_records{side="receiver",stage="kafka_writer",topic="a"} 1',
                   'diode_source_lag_records{side="receiver",stage="kafka_writer",topic="b"} 7']
    assert 'diode_rejects_total{side="receiver",stage="kafka_writer",reason="replayed"} 3' in \
        text.splitlines()
    assert "diode_bytes_in_flight{" in text
    del m.gauges[("source_lag_records", (("topic", "b"),))]
    assert 'topic="b"' not in m.text()


def test_process_labels_are_on_every_sample():
    text = sample_metrics().text()
    for line in text.splitlines():
        if not line.startswith("#"):
            assert 'side="receiver"' in line and 'stage="unpacker"' in line


def test_read_counter_round_trip_with_labels():
    text = sample_metrics().text()
    assert read_counter(text, "datagrams") == 5
    assert read_counter(text, "rejects") == 3
    assert read_counter(text, "rejects", reason="auth_failed") == 1
    assert read_counter(text, "rejects", reason="bad_magic") == 2
    assert read_counter(text, "rejects", reason="decode_failed") == 0
    assert read_counter(text, "rejects", side="receiver", reason="bad_magic") == 2
    assert read_counter(text, "rejects", side="sender") == 0
    assert read_counter(text, "records", topic="orders", partition="1") == 7
    odd = 'a "group", with=signs\\'  # (a label may hold any: a group's name)
    m = sample_metrics()
    m.inc("records", 2, topic=odd, partition="0")
    assert read_counter(m.text(), "records", topic=odd) == 2
    assert read_counter(text, "queue_depth") == 12
    assert read_counter(text, "missing") == 0


def test_read_counter_does_not_confuse_metric_name_prefixes():
    m = Metrics({"side": "sender"})
    m.inc("records", 3)
    m.inc("records_dropped", 100)
    assert read_counter(m.text(), "records") == 3


def test_read_counter_sums_files_of_several_processes():
    texts = []
    for i in range(3):
        m = Metrics({"side": "receiver", "stage": "kafka_writer", "index": str(i)})
        m.inc("records", 10 * (i + 1), topic="t")
        texts.append(m.text())
    assert read_counter("".join(texts), "records", topic="t") == 60


def test_gauges_are_replaced_not_summed():
    m = Metrics({})
    m.set("queue_depth", 5)
    m.set("queue_depth", 2)
    assert m.get("queue_depth") == 2
    assert read_counter(m.text(), "queue_depth") == 2


def test_fractional_values_survive():
    m = Metrics({"side": "sender"})
    m.inc("cpu_seconds", 0.25)
    m.inc("cpu_seconds", 0.5)
    assert read_counter(m.text(), "cpu_seconds") == pytest.approx(0.75)


def test_maybe_write_writes_the_text_atomically(tmp_path):
    path = tmp_path / "metrics" / "receiver-unpacker-0.prom"
    m = sample_metrics()
    m.path = str(path)
    m.maybe_write()
    assert path.read_text() == m.text()
    m.inc("datagrams", 10)
    m.maybe_write()  # within the interval: not rewritten
    assert read_counter(path.read_text(), "datagrams") == 5
    m.maybe_write(force=True)
    assert read_counter(path.read_text(), "datagrams") == 15
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("value", [1_234_567, 10_000_001, 2**40 + 3])
def test_large_counters_keep_every_unit(value):
    m = Metrics({"side": "sender"})
    m.inc("bytes", value)
    assert read_counter(m.text(), "bytes") == value


def test_cumulative_gauges_are_counters_and_latency_is_a_histogram():
    m = Metrics({"side": "receiver", "stage": "kafka_writer", "index": "0"})
    m.set("cpu_seconds", 12.5)  # a process's CPU so far: only grows
    for seconds in (0.004, 0.02, 0.02, 3.0, 100.0, 1000.0):
        m.observe("end_to_end_latency_seconds", seconds)
    lines = m.text().splitlines()
    assert "# TYPE diode_cpu_seconds_total counter" in lines
    assert "# TYPE diode_end_to_end_latency_seconds histogram" in lines
    labels = 'side="receiver",stage="kafka_writer",index="0"'
    assert f'diode_end_to_end_latency_seconds_bucket{{{labels},le="0.005"}} 1' in lines
    assert f'diode_end_to_end_latency_seconds_bucket{{{labels},le="0.025"}} 3' in lines
    assert f'diode_end_to_end_latency_seconds_bucket{{{labels},le="300.0"}} 5' in lines
    assert f'diode_end_to_end_latency_seconds_bucket{{{labels},le="+Inf"}} 6' in lines
    assert f"diode_end_to_end_latency_seconds_count{{{labels}}} 6" in lines
    assert read_counter(m.text(), "cpu_seconds") == 12.5


def test_the_prometheus_mirror_serves_what_the_worker_counted(tmp_path):
    """Two worker processes' metrics in prometheus_client's multiprocess files, collected as the
    HTTP exporter does: counters summed across a restart, a dead process's gauges gone."""
    import subprocess
    import sys
    code = """
import sys
from diode.runtime.metrics import Metrics
m = Metrics({"side": "receiver", "stage": "unpacker", "index": "0"},
            prometheus_dir=sys.argv[1])
m.inc("datagrams", int(sys.argv[2]))
m.inc("rejects", 2, reason="auth_failed")
m.set("journal_bytes", int(sys.argv[2]))
m.set("cpu_seconds", 1.5)
m.observe("end_to_end_latency_seconds", 0.02)
steps = m.histogram("step_seconds")
for _ in range(15000):  # (more steps than a second of observations was once kept)
    steps.observe(0.0002)
m.maybe_write(force=True)
m.inc("datagrams", 1)
steps.observe(2.0)
m.maybe_write(force=True)
print(__import__("os").getpid())
"""
    pids = [int(subprocess.run([sys.executable, "-c", code, str(tmp_path), str(n)], check=True,
                               capture_output=True, text=True).stdout) for n in (10, 20)]
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    multiprocess.mark_process_dead(pids[0], str(tmp_path))  # the first one died
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    labels = 'index="0",side="receiver",stage="unpacker"'
    assert f"diode_datagrams_total{{{labels}}} 32.0" in text  # 11 + 21: both lives count
    assert read_counter(text, "rejects", reason="auth_failed", side="receiver") == 4
    assert f"diode_journal_bytes{{{labels}}} 20.0" in text  # the live process's alone
    assert f"diode_cpu_seconds_total{{{labels}}} 3.0" in text
    assert f"diode_end_to_end_latency_seconds_count{{{labels}}} 2.0" in text
    # every step of both lives, in the step buckets
    assert f"diode_step_seconds_count{{{labels}}} 30002.0" in text
    assert read_counter(text, "step_seconds_bucket", le="0.00025") == 30000
    assert read_counter(text, "step_seconds_bucket", le="2.5") == 30002


def test_a_count_that_outlives_the_process_is_served_once_across_restarts(tmp_path):
    """The kernel's drop count of the udp_reader's socket outlives the reader (the supervisor
    made the socket): each restarted process sets the whole count, and the endpoint, which sums
    the dead processes' counters with the live one's, serves that count, not the earlier part
    again on top; a process's own count (its CPU) is summed over its lives."""
    import subprocess
    import sys
    code = """
import sys
from diode.runtime.metrics import Metrics
m = Metrics({"side": "receiver", "stage": "udp_reader", "index": "0"},
            prometheus_dir=sys.argv[1])
m.carry("socket_drops")
m.maybe_write(force=True)  # (before the count is read: the series from 0, nothing added)
for drops in sys.argv[2:]:
    m.set("socket_drops", int(drops))
    m.set("cpu_seconds", 1.0)
    m.maybe_write(force=True)
"""
    lives = [("40",), ("40", "55"), ("70",)]  # what the kernel counted at each export
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    served = []
    for counts in lives:
        subprocess.run([sys.executable, "-c", code, str(tmp_path), *counts], check=True)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
        text = generate_latest(registry).decode()
        served.append((read_counter(text, "socket_drops"), read_counter(text, "cpu_seconds")))
    assert served == [(40, 1), (55, 2), (70, 3)]


def test_a_stage_exports_every_series_of_its_own_from_zero_and_each_once():
    """Rates and alerts need a series before the first event; a count the stage sets (the
    writer's acknowledged records) is one series, not two."""
    from diode.runtime.metrics import CATALOG
    m = Metrics({"side": "receiver", "stage": "kafka_writer", "index": "0"})
    m.set("records", 42)
    text = m.text()
    series = [line.split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series))
    assert read_counter(text, "records") == 42
    assert read_counter(text, "missing_records") == 0 and "diode_missing_records_total{" in text
    assert read_counter(text, "rejects", reason="misrouted") == 0  # each reason from 0
    assert 'diode_rejects_total{side="receiver",stage="kafka_writer",index="0",' \
           'reason="misrouted"} 0' in text
    for name, metric in CATALOG.items():
        if "kafka_writer" in metric.stages and metric.kind != "histogram":
            # (per source topic: none until a topic has one)
            present = f"diode_{name}{{" in text or f"diode_{name}_total{{" in text
            assert present != metric.per_topic, name
    m.set("source_lag_records", 3, topic='odd"name')
    assert 'topic="odd\\"name"} 3' in m.text()  # (a label value stays inside its quotes)


def test_a_step_that_breaks_the_stage_contract_is_logged_naming_the_worker_at_most_once_a_minute(
        caplog):
    from diode.runtime.wiring import WorkerSpec
    from diode.runtime.worker import SlowSteps
    slow = SlowSteps(WorkerSpec("receiver", "kafka_writer", 1, ()), 20.0)
    with caplog.at_level("WARNING"):
        slow.saw(1.5)
        slow.saw(7.0)  # (within the minute: counted, not logged)
    [record] = caplog.records
    assert record.name == "diode.receiver/kafka_writer-1"
    assert "kafka_writer" in record.getMessage() and "1.5 s" in record.getMessage()
    assert slow.count == 1 and slow.longest == 7.0  # said with the next warning
