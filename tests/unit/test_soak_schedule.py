"""diode.soak.schedule: a fault schedule is read as written, every mistake in it is named before
anything starts, and the built-in schedule runs every kind of fault within the soak."""

import pytest

from diode.soak.schedule import (KINDS, LOSSY, ScheduleError, default_schedule,
                                 format_duration, from_dict, load, parse_duration)


def test_durations_in_every_spelling():
    assert [parse_duration(v) for v in (90, "90", "90s", "1m30s", 1.5, "2h", "1h5m")] == \
        [90, 90, 90, 90, 1.5, 7200, 3900]
    for bad in ("soon", "-5", "1x", True):
        with pytest.raises(ScheduleError):
            parse_duration(bad)
    assert format_duration(90) == "1m30s" and format_duration(3600) == "1h"


def test_every_kind_parses_with_defaults_sorted_by_start():
    data = {"faults": [{"kind": k, "at": f"{600 - 40 * i}s"} for i, k in enumerate(KINDS)]}
    faults = from_dict(data, 3600, seed=1)
    assert {f.kind for f in faults} == set(KINDS)
    assert [f.start for f in faults] == sorted(f.start for f in faults)
    loss = next(f for f in faults if f.kind == "link-loss")
    assert loss.params == {"loss": 0.01} and loss.duration == 30
    restart = next(f for f in faults if f.kind == "receiver-restart")
    assert restart.duration == 5 and restart.params == {"signal": "term"}
    kill = next(f for f in faults if f.kind == "kill-worker")
    assert kill.duration == 0 and kill.params == {"side": "any", "stage": None}


def test_every_expands_until_the_end():
    faults = from_dict({"faults": [{"every": "10m", "start": "5m", "kind": "kill-worker",
                                    "side": "receiver", "stage": "unpacker"}]}, 3600, seed=1)
    assert [f.start for f in faults] == [300, 900, 1500, 2100, 2700, 3300]
    assert len({f.seed for f in faults}) == 6  # each its own draw


def test_every_mistake_is_named_at_once():
    data = {"faults": [{"at": 10, "kind": "link-flood"},
                       {"at": 20, "kind": "link-loss", "los": 0.1},
                       {"at": 30, "kind": "link-loss", "loss": 1.5, "duration": 5},
                       {"at": 100, "kind": "link-down", "duration": "30s"},
                       {"at": 50, "kind": "link-delay", "duration": 20},
                       {"at": 60, "kind": "link-reorder", "duration": 5},
                       {"at": 40, "kind": "kill-worker", "side": "sender",
                        "stage": "unpacker"}]}
    with pytest.raises(ScheduleError) as e:
        from_dict(data, 120, seed=1)
    text = str(e.value)
    assert "unknown kind 'link-flood'" in text and "link-loss" in text  # the known kinds
    assert "unknown key 'los'" in text
    assert "loss must be a probability" in text
    assert "ends at 2m10s, after the soak's 2m" in text
    assert "overlap: one link fault at a time" in text
    assert "stage unpacker is not on the sender side" in text


def test_a_file_that_is_missing_or_not_yaml_names_its_path(tmp_path):
    with pytest.raises(ScheduleError, match="nowhere.yaml"):
        load(tmp_path / "nowhere.yaml", 600, 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [\n")
    with pytest.raises(ScheduleError, match="bad.yaml is not valid YAML"):
        load(bad, 600, 1)


@pytest.mark.parametrize("duration", [120, 600, 3600])
def test_the_built_in_schedule_runs_every_kind_inside_the_quiet_margins(duration):
    faults = default_schedule(duration, seed=7)
    assert {f.kind for f in faults} == set(KINDS)
    assert {f.params["side"] for f in faults if f.kind == "kill-worker"} == {"sender",
                                                                          "receiver"}
    first, last = max(10, duration * 0.1), duration - max(25, duration * 0.15)
    assert all(first <= f.start and f.end <= last + 0.5 for f in faults)
    links = sorted((f for f in faults if f.link), key=lambda f: f.start)
    assert all(a.end <= b.start for a, b in zip(links, links[1:]))
    assert default_schedule(duration, seed=7) == faults
    assert len({f.seed for f in faults}) == len(faults)
    assert [f.seed for f in default_schedule(duration, seed=8)] != [f.seed for f in faults]
    assert LOSSY < set(KINDS)


def test_a_soak_too_short_for_the_built_in_schedule_says_the_minimum():
    with pytest.raises(ScheduleError, match="at least 1m"):
        default_schedule(30, seed=1)
