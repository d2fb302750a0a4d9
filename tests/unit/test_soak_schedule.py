"""diode.soak.schedule: a fault schedule is read as written, every mistake in it is named before
anything starts, and the built-in schedule runs every kind of fault within the soak."""

import pytest

from diode.soak.schedule import (KINDS, LOSSY, ScheduleError, default_schedule,
                                 format_duration, from_dict, load, parse_duration)

EVERY_KIND = """\
seed: 7
faults:
  - {at: 1h5m, kind: source-pause}
  - {at: "90", kind: link-loss, duration: 20s, loss: 0.02}
  - {at: 30, kind: link-burst}
  - {at: 2m, kind: receiver-restart, down: 5s}
  - {at: 3m, kind: link-reorder, delay_ms: 80}
  - {at: 4m, kind: link-duplicate}
  - {at: 5m, kind: link-corrupt, probability: 0.1}
  - {at: 6m, kind: link-delay}
  - {at: 1m30s, kind: kill-worker, side: receiver, stage: unpacker}
  - {at: 7m, kind: link-down, duration: 1m}
  - {at: 2m, kind: sender-restart, signal: kill}
  - {at: 8m, kind: destination-pause}
  - {at: 9m, kind: destination-stop, duration: 0.5m}
"""


def problems_of(data, duration=120):
    with pytest.raises(ScheduleError) as e:
        from_dict(data, duration, seed=1)
    return str(e.value)


def test_durations_in_every_spelling():
    spellings = (90, "90", "90s", "1m30s", 1.5, "2h", "1h5m", "1m 30s")
    assert [parse_duration(v) for v in spellings] == [90, 90, 90, 90, 1.5, 7200, 3900, 90]
    for bad in ("soon", "-5", -5, "1x", "", "30s1m", True, None, float("nan")):
        with pytest.raises(ScheduleError):
            parse_duration(bad)
    assert [format_duration(s) for s in (90, 3600, 3900, 2.5, 0, 130)] == \
        ["1m30s", "1h", "1h5m", "2.5s", "0s", "2m10s"]


def test_a_file_with_every_kind_parses_with_defaults_sorted_by_start(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(EVERY_KIND)
    faults = load(path, 7200, seed=1)
    assert {f.kind for f in faults} == set(KINDS)
    assert [f.start for f in faults] == [30, 90, 90, 120, 120, 180, 240, 300, 360, 420, 480,
                                         540, 3900]
    # ties keep file order: link-loss before kill-worker, receiver- before sender-restart
    assert [f.kind for f in faults][1:5] == ["link-loss", "kill-worker", "receiver-restart",
                                             "sender-restart"]
    by_kind = {f.kind: f for f in faults}
    assert by_kind["link-loss"].duration == 20 and by_kind["link-loss"].params == {"loss": 0.02}
    assert by_kind["link-burst"].duration == 30
    assert by_kind["link-burst"].params == {"probability": 0.002, "length": 20}
    assert by_kind["link-reorder"].params == {"probability": 0.05, "delay_ms": 80}
    assert by_kind["link-down"].duration == 60 and by_kind["destination-stop"].duration == 30
    assert by_kind["receiver-restart"].duration == 5
    assert by_kind["receiver-restart"].params == {"signal": "term"}
    assert by_kind["sender-restart"].duration == 2
    assert by_kind["sender-restart"].params == {"signal": "kill"}
    kill = by_kind["kill-worker"]
    assert kill.duration == 0 and kill.params == {"side": "receiver", "stage": "unpacker"}
    assert by_kind["link-loss"].describe() == "link-loss loss=0.02 for 20s"
    assert kill.describe() == "kill-worker side=receiver stage=unpacker"
    assert by_kind["link-loss"].as_dict() == {"kind": "link-loss", "start": 90, "end": 110,
                                              "duration": 20, "seed": by_kind["link-loss"].seed,
                                              "loss": 0.02}


def test_every_expands_to_its_start_times_and_stops_before_the_end():
    faults = from_dict({"faults": [{"every": "10m", "start": "5m", "kind": "kill-worker",
                                    "side": "receiver"}]}, 3600, seed=1)
    assert [f.start for f in faults] == [300, 900, 1500, 2100, 2700, 3300]
    # start defaults to every; a repetition that would end after the soak is left out
    faults = from_dict({"faults": [{"every": "20m", "kind": "link-down", "duration": "1m"}]},
                       3630, seed=1)
    assert [f.start for f in faults] == [1200, 2400]
    text = problems_of({"faults": [{"every": "5m", "kind": "link-loss"}]}, duration=120)
    assert "faults[0] (link-loss every 5m): does not fit in the soak's 2m even once" in text


def test_an_unknown_kind_is_named_with_the_known_kinds():
    text = problems_of({"faults": [{"at": 10, "kind": "link-flood"}]})
    assert "faults[0] (link-flood at 10): unknown kind 'link-flood'" in text
    assert all(kind in text for kind in KINDS)


def test_unknown_keys_and_values_out_of_range_are_named_with_their_fault():
    text = problems_of({"faults": [{"at": "30s", "kind": "link-loss", "los": 0.1},
                                   {"at": 60, "kind": "link-loss", "loss": 1.5, "duration": 5},
                                   {"at": 70, "kind": "link-burst", "length": 0, "duration": 5},
                                   {"at": 80, "kind": "kill-worker", "side": "sender",
                                    "stage": "unpacker"},
                                   {"at": 90, "every": 10, "kind": "source-pause"}],
                       "sede": 3})
    assert "faults[0] (link-loss at 30s): unknown key 'los' (did you mean loss?)" in text
    assert "faults[1] (link-loss at 60): loss must be a probability in (0, 1], not 1.5" in text
    assert "faults[2] (link-burst at 70): length must be a whole number" in text
    assert "stage unpacker is not on the sender side" in text
    assert "faults[4] (source-pause at 90): give either `at`, or `every`" in text
    assert "sede: unknown key" in text
    assert text.startswith("<schedule>: 6 problem(s)\n")  # each on its own line


def test_a_fault_that_ends_after_the_soak_is_refused():
    text = problems_of({"faults": [{"at": 100, "kind": "link-down", "duration": "30s"}]})
    assert "faults[0] (link-down at 100): ends at 2m10s, after the soak's 2m" in text


def test_overlapping_link_faults_are_refused_naming_both():
    text = problems_of({"faults": [{"at": 10, "kind": "link-loss", "duration": 20},
                                   {"at": 25, "kind": "link-delay", "duration": 5}]})
    assert ("faults[0] (link-loss at 10) and faults[1] (link-delay at 25) overlap: one link "
            "fault at a time") in text
    # one process fault of a kind at a time; other kinds and link faults may run alongside
    text = problems_of({"faults": [{"at": 10, "kind": "source-pause"},
                                   {"at": 20, "kind": "source-pause"}]})
    assert "overlap: one source-pause at a time" in text
    # a repeated fault longer than its interval is named once, not once per repetition
    text = problems_of({"faults": [{"every": "20s", "kind": "link-loss"}]}, duration=3600)
    assert text.startswith("<schedule>: 1 problem(s)") and "overlap" in text
    faults = from_dict({"faults": [{"at": 10, "kind": "link-loss"},
                                   {"at": 10, "kind": "source-pause"},
                                   {"at": 15, "kind": "destination-pause"},
                                   {"at": 20, "kind": "kill-worker"}]}, 120, seed=1)
    assert len(faults) == 4


def test_two_problems_in_one_file_are_both_reported(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text("faults:\n  - {at: 10, kind: link-loss, los: 0.1}\n"
                    "  - {at: 110, kind: source-pause}\n")
    with pytest.raises(ScheduleError) as e:
        load(path, 120, seed=1)
    text = str(e.value)
    assert text.startswith(f"{path}: 2 problem(s)")
    assert "unknown key 'los'" in text and "ends at 2m10s, after the soak's 2m" in text


def test_a_file_that_is_missing_or_not_yaml_names_its_path(tmp_path):
    with pytest.raises(ScheduleError, match="(?s)nowhere.yaml: .*cannot read"):
        load(tmp_path / "nowhere.yaml", 600, 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [\n")
    with pytest.raises(ScheduleError, match="(?s)bad.yaml: .*not valid YAML"):
        load(bad, 600, 1)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ScheduleError, match="(?s)empty.yaml: .*must be a mapping"):
        load(empty, 600, 1)


@pytest.mark.parametrize("duration", [120, 600, 3600])
def test_the_built_in_schedule_runs_every_kind_inside_the_quiet_margins(duration):
    faults = default_schedule(duration, seed=7)
    assert {f.kind for f in faults} == set(KINDS) and len(KINDS) == 13
    assert {f.params["side"] for f in faults if f.kind == "kill-worker"} == {"sender",
                                                                          "receiver"}
    first, last = max(10, duration * 0.1), duration - max(25, duration * 0.15)
    assert all(first <= f.start and f.end <= last for f in faults)
    links = [f for f in faults if f.link]
    assert all(a.end <= b.start for a, b in zip(links, links[1:]))
    # what it gives passes the checks of a file
    entries = [{"kind": f.kind, "at": f.start, **{k: v for k, v in f.params.items()
                                                  if v is not None}} for f in faults]
    for entry, f in zip(entries, faults):
        if f.kind.endswith("-restart"):
            entry["down"] = f.duration
        elif f.kind != "kill-worker":
            entry["duration"] = f.duration
    assert from_dict({"faults": entries}, duration, seed=7) == faults
    # deterministic for a seed; each fault its own seed
    assert default_schedule(duration, seed=7) == faults
    assert len({f.seed for f in faults}) == len(faults)


def test_long_soaks_repeat_the_cycle():
    faults = default_schedule(3600, seed=7)
    assert sum(f.kind == "link-loss" for f in faults) == 3
    assert max(f.duration for f in faults if f.kind == "link-down") <= 15


def test_a_soak_too_short_for_the_built_in_schedule_says_the_minimum():
    with pytest.raises(ScheduleError, match="at least 1m"):
        default_schedule(30, seed=1)


def test_fault_seeds_are_stable_for_a_file_and_its_seed(tmp_path):
    path = tmp_path / "faults.yaml"
    path.write_text(EVERY_KIND)
    seeds = [f.seed for f in load(path, 7200, seed=1)]
    assert [f.seed for f in load(path, 7200, seed=1)] == seeds
    assert [f.seed for f in load(path, 7200, seed=2)] == seeds  # the file's seed: 7 wins
    path.write_text(EVERY_KIND.replace("seed: 7", "seed: 8"))
    assert [f.seed for f in load(path, 7200, seed=1)] != seeds
    data = {"faults": [{"every": "1m", "kind": "kill-worker"}]}
    assert [f.seed for f in from_dict(data, 600, seed=1)] != \
        [f.seed for f in from_dict(data, 600, seed=2)]


def test_lossy_kinds_are_those_that_may_lose_records():
    assert LOSSY < set(KINDS)
    assert not LOSSY & {"link-reorder", "link-duplicate", "link-delay", "destination-pause",
                        "destination-stop", "source-pause"}
