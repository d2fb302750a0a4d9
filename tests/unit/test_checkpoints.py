"""diode.runtime.checkpoints: where a replay starts, whatever the writer count was."""

import json

from diode.runtime import checkpoints


def test_replay_starts_at_the_lowest_writer_checkpoint_and_waits_for_every_writer(tmp_path):
    d = str(tmp_path)
    assert checkpoints.low_water(d, 2) is None  # no checkpoint yet: from the journal's start
    checkpoints.save(d, 0, 5000, [["t", 0, {"frontier": 9}]], 2, 1, sync=True)
    assert checkpoints.low_water(d, 2) is None  # writer 1 has none yet
    checkpoints.save(d, 1, 3000, [["t", 1, {"frontier": 4}]], 2, 2, sync=False)
    assert checkpoints.low_water(d, 2) == 3000
    # one writer fewer after a restart: its file is not waited for, its partitions are found
    assert checkpoints.low_water(d, 1) == 5000
    found = {(t, p) for data in checkpoints.load_all(d) for t, p, _ in data["partitions"]}
    assert found == {("t", 0), ("t", 1)}


def test_a_damaged_checkpoint_is_left_out_not_fatal(tmp_path):
    d = str(tmp_path)
    checkpoints.save(d, 0, 10, [], 2, 1, sync=False)
    (tmp_path / "checkpoint-1.json").write_text("{not json")
    assert [c["writer"] for c in checkpoints.load_all(d)] == [0]
    assert checkpoints.low_water(d, 2) is None  # replay everything rather than guess
    assert not list(tmp_path.glob("*.new"))     # saves are atomic: nothing half written


def test_a_checkpoint_of_an_earlier_diode_is_not_used(tmp_path):
    """Version 1 checkpoints hold states that name no source incarnation: whatever they say
    could be of a topic since recreated, so they are left out (the destination's provenance
    headers are read instead) and the journal is replayed from its start."""
    (tmp_path / "checkpoint-0.json").write_text(
        '{"version": 1, "writer": 0, "writers": 1, "low_water": 9, "time_ms": 1, '
        '"partitions": [["t", 0, {"frontier": 9}]]}')
    assert checkpoints.load_all(str(tmp_path)) == []
    assert checkpoints.low_water(str(tmp_path), 1) is None


def test_changes_damaged_on_disk_leave_the_whole_checkpoint_used_and_say_so(tmp_path, caplog):
    """Changes that name their whole checkpoint but are not whole themselves (a disk that
    damaged them): the whole checkpoint alone, logged, never a writer that cannot start."""
    checkpoints.save(str(tmp_path), 0, 4000, [["t", 0, {"frontier": 9}]], 1, 1000, False,
                     {0: 17}, whole_id="w1")
    (tmp_path / "checkpoint-0.changes.json").write_text(json.dumps({
        "version": checkpoints.VERSION, "writer": 0, "changes_to": "w1", "low_water": 9000}))
    data = checkpoints.load(str(tmp_path), 0)
    assert data["low_water"] == 4000 and data["partitions"] == [["t", 0, {"frontier": 9}]]
    assert "checkpoint changes left out" in caplog.text


def test_low_waters_asked_every_second_read_a_checkpoint_again_only_once_it_changed(
        tmp_path, monkeypatch):
    """The udp_reader asks where its journal may be released every second: the answer is
    low_water's, as each writer's files change (a whole checkpoint, its changes, damage), and
    a checkpoint that did not change is not read again (at 10 000 partitions each read
    parsed 2.6 MB)."""
    d = str(tmp_path)
    waters = checkpoints.LowWaters(d, 2)
    assert waters.get() is None
    checkpoints.save(d, 0, 5000, [["t", 0, {"frontier": 9}]], 2, 1, sync=False, whole_id="a")
    assert waters.get() is None  # writer 1 has none yet
    checkpoints.save(d, 1, 3000, [["t", 1, {"frontier": 4}]], 2, 2, sync=False)
    assert waters.get() == 3000
    loads = []
    real = checkpoints.load
    monkeypatch.setattr(checkpoints, "load", lambda *a: loads.append(a) or real(*a))
    assert [waters.get() for _ in range(5)] == [3000] * 5 and loads == []
    checkpoints.save(d, 1, 7000, [["t", 1, {"frontier": 8}]], 2, 3, sync=False)
    assert waters.get() == 5000 and loads == [(d, 1)]  # (writer 0's as it was)
    checkpoints.save_changes(d, 0, "a", 6000, [["t", 0, {"frontier": 12}]], [], 4, sync=False)
    assert waters.get() == 6000 and loads == [(d, 1), (d, 0)]
    assert checkpoints.low_water(d, 2) == 6000
    (tmp_path / "checkpoint-1.json").write_text("{not json")
    assert waters.get() is None  # replay everything rather than guess
