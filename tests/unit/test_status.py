"""`diode status`: what a person reads and what a script parses (diode.status)."""

import json
import time
from types import SimpleNamespace

from diode import status
from diode.runtime import launches

WORKERS = [("sender", "kafka_reader"), ("sender", "udp_sender"),
           ("receiver", "udp_reader"), ("receiver", "unpacker"), ("receiver", "kafka_writer")]


def _text(records: dict, datagram_bytes: dict) -> str:
    """Prometheus text of the five workers: records (and bytes) counted by each."""
    lines = []
    for side, stage in WORKERS:
        labels = f'side="{side}",stage="{stage}",index="0"'
        lines.append(f"diode_records_total{{{labels}}} {records.get(stage, 0)}")
        lines.append(f"diode_cpu_seconds_total{{{labels}}} 0")
        if stage in datagram_bytes:
            lines.append(f"diode_bytes_total{{{labels}}} {datagram_bytes[stage]}")
    return "\n".join(lines) + "\n"


def test_rates_carry_their_units_and_each_side_counts_its_records(tmp_path, monkeypatch):
    monkeypatch.setattr(status.time, "sleep", lambda s: None)
    (tmp_path / launches.STATUS_FILE).write_text(json.dumps({"workers": [
        {"side": side, "stage": stage, "index": 0, "name": f"{side}/{stage}-0",
         "state": "running", "pid": None, "cpus": [], "restarts": 0, "message": ""}
        for side, stage in WORKERS]}))
    entry = {"pid": 1, "topology": "t.yaml", "name": "t", "sides": ["sender", "receiver"],
             "run_dir": str(tmp_path), "started": time.time() - 60}

    def snap(t, text):
        return {"t": t, "texts": [text],
                **{m: status._per_worker([text], m) for m in ("records", "datagrams", "bytes",
                                                               "cpu_seconds")}}
    before = snap(0.0, _text({"kafka_reader": 10_000, "udp_sender": 9_000, "unpacker": 8_000,
                              "kafka_writer": 7_000}, {"udp_sender": 0, "udp_reader": 0}))
    after = snap(2.0, _text({"kafka_reader": 12_468, "udp_sender": 11_468, "unpacker": 10_000,
                             "kafka_writer": 9_000},
                            {"udp_sender": 24_600_000, "udp_reader": 2_000}))
    s = status.launch_status(entry, before, after)

    assert s["sender"] == {"records_read": 12_468, "records_read_per_second": 1_234.0,
                           "records_sent": 11_468, "records_sent_per_second": 1_234.0,
                           "bytes_per_second": 12_300_000.0, "inflight_records": 0,
                           "dead_letter_records": 0}
    assert s["receiver"] == {"records_received": 10_000, "records_received_per_second": 1_000.0,
                             "records_written": 9_000, "records_written_per_second": 1_000.0,
                             "bytes_per_second": 1_000.0}
    writer = next(w for w in s["workers"] if w["stage"] == "kafka_writer")
    assert writer["records_per_second"] == 1_000.0 and "bytes_per_second" not in writer
    json.dumps(s)  # what --json prints

    text = status.render(s)
    assert "1 234 records/s" in text and "12.3 MB/s" in text and "1.0 kB/s" in text
    assert "12 468 records read" in text and "11 468 sent" in text
    assert "10 000 records received" in text and "9 000 written" in text
    assert "CPU % of one core" in text


def test_json_prints_an_empty_list_when_nothing_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIODE_STATE_DIR", str(tmp_path))
    args = SimpleNamespace(topology=None, run_dir=None, seconds=0.0, json=True)
    assert status.main(args) == 1  # as documented: exit 1 when nothing runs
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and "no diode launch is running" in out.err
