"""`diode status`: what a person reads and what a script parses (diode.status)."""

import json
import os
import time
from types import SimpleNamespace

from diode import status
from diode.runtime import launches
from tests.conftest import posing_as_launch

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


def test_json_prints_an_empty_list_when_nothing_runs(tmp_path, capsys):
    args = SimpleNamespace(topology=str(tmp_path / "never-launched.yaml"), run_dir=None,
                           seconds=0.0, json=True)
    assert status.main(args) == 1  # as documented: exit 1 when nothing runs
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and "no diode launch is running" in out.err


def test_a_launch_is_found_by_its_title_and_its_run_dir_whatever_the_environment(
        tmp_path, monkeypatch, capsys):
    """No registry of the user's: the supervisor's title names its run directory, so a status
    run with another HOME, working directory and no XDG_RUNTIME_DIR finds it, and finds it by
    that run directory too (relative to where it is run)."""
    topology = tmp_path / "plant1.yaml"
    run_dir = tmp_path / "run" / "receiver-plant1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("DIODE_STATE_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(elsewhere))
    monkeypatch.chdir(elsewhere)
    with posing_as_launch(topology, ("receiver",), run_dir):
        found = launches.running(str(topology))
        assert [(e["pid"], e["sides"], e["run_dir"]) for e in found] == [
            (os.getpid(), ["receiver"], str(run_dir))]
        by_dir = SimpleNamespace(topology=None, run_dir=["../run/receiver-plant1"],
                                 seconds=0.0, json=True)
        assert status.main(by_dir) == 0
        shown, = json.loads(capsys.readouterr().out)
        assert shown["pid"] == os.getpid() and shown["run_dir"] == str(run_dir)
    assert launches.running(str(topology)) == []  # its title gone: not running


def test_a_run_dir_named_whose_launch_stopped_says_so(tmp_path, capsys):
    stale = tmp_path / "run"
    stale.mkdir()
    (stale / launches.STATUS_FILE).write_text(json.dumps({"pid": 2 ** 22 + 1,
                                                          "workers": []}))
    args = SimpleNamespace(topology=None, run_dir=[str(stale), str(tmp_path / "nothing")],
                           seconds=0.0, json=False)
    assert status.main(args) == 1
    said = capsys.readouterr().err
    assert f"{stale}: no launch is running there; the last one (supervisor pid " \
        f"{2 ** 22 + 1}) wrote its status at" in said
    assert f"{tmp_path / 'nothing'}: no launch's status file" in said


def test_a_run_dir_this_user_cannot_read_is_shown_with_why():
    entry = {"pid": 7, "topology": "/etc/diode/plant1.yaml", "name": None,
             "sides": ["receiver"], "run_dir": "/run/diode/receiver-plant1",
             "started": time.time() - 90,
             "unreadable": "Permission denied: /run/diode/receiver-plant1/supervisor.json"}
    s = status.launch_status(entry, {}, {})
    text = status.render(s)
    assert text.splitlines()[0].startswith("plant1 (/etc/diode/plant1.yaml): receiver, "
                                           "supervisor pid 7, up 1m30s")
    assert "cannot read its run directory: Permission denied" in text
    assert "run diode status as root" in text
    json.dumps(s)
