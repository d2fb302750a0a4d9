"""The writer's recovery room (diode.writer.recovery): a checkpoint is saved only once the
destination has acknowledged everything, and a restarted writer gets its partitions back from
it, tickets included; what waits for the destination's holdings is asked of once and handed
back in its order, the frontier raised to what the destination holds."""

import json
import time

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.kafka import identity
from diode.kafka.preparer import HoldingsAnswer
from diode.link.records import NO_INCARNATION
from diode.runtime import checkpoints
from diode.runtime.messages import Mark
from diode.writer.held import Held
from diode.writer.recovery import Recovery
from tests.unit.writer_fakes import LOG, metrics, run, settings


def recovery(tmp_path, resuming=False, held=False):
    sources, asked = {}, []

    def state(topic, partition, incarnation, now=None):
        source = sources.setdefault((topic, partition), SourcePartition())
        if source.current is None:
            source.current = PartitionState(0.0, incarnation=incarnation)
        return source.current

    rec = Recovery(settings(**{"missing.records.topic": "missing"}), metrics(), LOG, tmp_path,
                   0, 1, sources=sources, source_partitions={"t": 2},
                   owns=lambda t, p: True, name_of=lambda t: "dst_" + t, state=state,
                   ask_holdings=lambda *a: asked.append(a), resuming=resuming,
                   held=Held(sources) if held else None)
    return rec, state, asked


def test_a_checkpoint_is_saved_once_acknowledged_and_restores_the_partitions(tmp_path):
    rec, state, _ = recovery(tmp_path)
    s = state("t", 1, NO_INCARNATION)
    s.frontier = 41
    s.open_ticket(30, 35, 1000)
    answers = iter(["waiting", None])
    rec.checkpoint(time.monotonic(), [None], {}, lambda wait: next(answers))
    assert rec.flushing is None and not list(tmp_path.iterdir())  # marks not trusted: none
    rec.checkpoint(time.monotonic(), [Mark(100, 5.0)], {3: 17}, lambda wait: next(answers))
    assert rec.flushing is not None and rec.metrics.get("checkpoints") == 0
    rec.flushed(time.monotonic(), lambda wait: next(answers))
    assert rec.flushing is None and rec.metrics.get("checkpoints") == 1
    assert rec.metrics.get("checkpoint_low_water") == 100

    again, _, _ = recovery(tmp_path)
    heard = {}
    again.restore(lambda reader, sent: heard.setdefault(reader, sent))
    restored = again.sources[("t", 1)].current
    assert restored.frontier == 41 and [(t.first, t.last) for t in restored.tickets] == [(30, 35)]
    assert heard == {3: 17} and again.resuming


def test_what_waits_for_the_destination_is_asked_once_and_handed_back_in_order(tmp_path):
    rec, state, asked = recovery(tmp_path)
    key = ("t", 0, NO_INCARNATION)
    first, second = run(0, 2), run(2, 2)
    for item in (first, second):
        if not rec.recover(*key):
            rec.unrecovered[item.topic].append(item)
    assert not asked  # (asked at the turn's ask_again, with every other topic met)
    rec.ask_again()
    rec.ask_again()
    assert len(asked) == 1  # (once per topic, for every partition of it this writer owns)
    questions, missing_topic, _ = asked[0]
    assert missing_topic == "missing"
    [(topic, (destination, wanted))] = questions.items()
    assert (topic, destination) == ("t", "dst_t")
    assert wanted == {("t", 0, NO_INCARNATION), ("t", 1, NO_INCARNATION)}
    ready = rec.recovered_by(HoldingsAnswer("t", frozenset(wanted), {key: 0}, {}, None), 0.0)
    assert ready == [first, second] and rec.recover(*key)
    assert state(*key).frontier == 0  # the destination holds offset 0: not written again


def test_a_destination_that_cannot_be_read_is_asked_again_later(tmp_path):
    rec, _, asked = recovery(tmp_path)
    key = ("t", 0, NO_INCARNATION)
    rec.recover(*key)
    rec.unrecovered["t"].append(run(0, 1))
    rec.ask_again()
    assert rec.recovered_by(HoldingsAnswer("t", frozenset(), {}, None, "down"), 0.0) == []
    rec.ask_again()
    assert len(asked) == 1 and rec.metrics.get("errors", reason="recovery") == 1
    rec.recover_at["t"] = 0.0  # (RECOVER_AGAIN_SECONDS later)
    rec.ask_again()
    assert len(asked) == 2


def test_a_destination_topic_whose_leaders_are_being_made_is_read_again_soon(tmp_path):
    """A topic just created (by the metadata sync, ahead of its records): its partitions'
    leaders refuse ListOffsets for a moment. It is asked of again within a second, not after
    RECOVER_AGAIN_SECONDS, and counted as no error; a destination that cannot be read still
    waits the whole time."""
    rec, _, asked = recovery(tmp_path)
    rec.recover("t", 0, NO_INCARNATION)
    rec.unrecovered["t"].append(run(0, 1))
    rec.ask_again()
    before = time.monotonic()
    for _ in range(3):  # (said once, however many tries it takes)
        assert rec.recovered_by(HoldingsAnswer(
            "t", frozenset(), {}, None, "destination cluster: topic dst_t: Broker: Not leader "
            "for partition"), 0.0) == []
    assert rec.recover_at["t"] - before < 1.0 and rec.metrics.get("errors", reason="recovery") \
        == 0 and rec.settling == {"t"}
    time.sleep(rec.recover_at["t"] - time.monotonic() + 0.01)
    rec.ask_again()
    assert len(asked) == 2
    rec.recovered_by(HoldingsAnswer("t", frozenset(), {}, None, "Broker: Request timed out"), 0.0)
    assert rec.recover_at["t"] - time.monotonic() > 4.0 and \
        rec.metrics.get("errors", reason="recovery") == 1


def test_the_topics_met_in_a_turn_are_asked_of_in_one_question(tmp_path):
    rec, _, asked = recovery(tmp_path)
    topics = [f"t{i}" for i in range(200)]
    for topic in topics:
        for partition in range(2):
            key = (topic, partition, NO_INCARNATION)
            if not rec.recover(*key):
                rec.unrecovered[topic].append(run(0, 1, partition=partition, topic=topic))
    rec.ask_again()
    assert len(asked) == 1  # (one question: the Preparer reads them together)
    questions, missing_topic, _ = asked[0]
    assert sorted(questions) == sorted(topics) and missing_topic == "missing"
    assert questions["t7"] == ("dst_t7", {("t7", 0, NO_INCARNATION), ("t7", 1, NO_INCARNATION)})
    for topic in topics:  # (answered per topic: each hands back what waited for it)
        wanted = frozenset(questions[topic][1])
        assert len(rec.recovered_by(HoldingsAnswer(topic, wanted, {}, {}, None), 0.0)) == 2
    rec.ask_again()
    assert len(asked) == 1 and not rec.unrecovered


def checkpointed(rec, marks=(Mark(100, 5.0),), heard=None) -> None:
    """A checkpoint of `rec` with the destination acknowledging everything at once."""
    rec.checkpoint(time.monotonic(), list(marks), heard or {}, lambda wait: None)


def test_a_checkpoint_writes_nothing_when_nothing_changed_then_only_what_changed(tmp_path):
    rec, state, _ = recovery(tmp_path)
    for p in range(100):
        state(f"t{p // 5}", p % 5, NO_INCARNATION).frontier = p
    checkpointed(rec)
    whole = tmp_path / "checkpoint-0.json"
    changes = tmp_path / "checkpoint-0.changes.json"
    assert rec.metrics.get("checkpoints") == 1 and whole.exists() and not changes.exists()
    written = whole.read_bytes()
    checkpointed(rec)  # nothing changed: nothing written, nothing flushed
    assert rec.metrics.get("checkpoints") == 1 and rec.flushing is None
    assert whole.read_bytes() == written and not changes.exists()

    state("t3", 1, NO_INCARNATION).frontier = 500
    checkpointed(rec)  # one partition changed: only it, over the whole one
    assert rec.metrics.get("checkpoints") == 2 and whole.read_bytes() == written
    saved = json.loads(changes.read_text())
    assert [e[:2] for e in saved["partitions"]] == [["t3", 1]]
    checkpointed(rec, [Mark(150, 6.0)])  # the low water moved: the changes again, with it
    assert rec.metrics.get("checkpoints") == 3 and whole.read_bytes() == written
    assert json.loads(changes.read_text())["low_water"] == 150

    again, _, _ = recovery(tmp_path)  # (a restart: the whole one with its changes)
    again.restore(lambda reader, sent: None)
    assert again.sources[("t3", 1)].current.frontier == 500
    assert again.sources[("t4", 2)].current.frontier == 22 and len(again.sources) == 100
    assert checkpoints.low_water(str(tmp_path), 1) == 150

    for p in range(40):  # (a quarter of the partitions and more: a whole one again)
        state(f"t{p // 5}", p % 5, NO_INCARNATION).frontier = 1000 + p
    checkpointed(rec, [Mark(150, 6.0)])
    assert rec.metrics.get("checkpoints") == 4 and not changes.exists()
    assert whole.read_bytes() != written


def test_a_checkpoint_written_by_the_diode_before_changes_files_is_restored(tmp_path):
    """The whole checkpoint as main's code wrote it (no id, no changes file): restored, and
    the first checkpoint after it is whole again; changes naming another whole checkpoint
    (left by a crash) are refused and logged, the whole one used alone."""
    inc = "AQEBAQEBAQEBAQEBAQEBAQ"
    (tmp_path / "checkpoint-0.json").write_text(json.dumps({
        "version": 2, "writer": 0, "writers": 1, "low_water": 4000, "time_ms": 1700000000000,
        "partitions": [["t", 0, {"frontier": 9, "gaps": [[3, 4]], "unknown": [], "wait": 0.5,
                                 "expected": [], "retired": False, "retiring": False,
                                 "source_end": -1, "log_start": 0, "tickets": [],
                                 "last_timestamp": 1000, "chains": [],
                                 "destination": "dst_t", "incarnation": inc,
                                 "current": True}]],
        "readers": {"0": 17}}))
    (tmp_path / "checkpoint-0.changes.json").write_text(json.dumps({
        "version": 2, "writer": 0, "changes_to": "another", "low_water": 9000,
        "time_ms": 1700000005000, "partitions": [], "dropped": [["t", 0]], "readers": {}}))
    rec, _, _ = recovery(tmp_path)
    heard = {}
    rec.restore(lambda reader, sent: heard.setdefault(reader, sent))
    state = rec.sources[("t", 0)].current
    assert state.frontier == 9 and state.gaps == [[3, 4]] and heard == {0: 17}
    assert identity.text(state.incarnation) == inc
    assert rec.resuming and rec.since_ms == 1700000000000
    assert checkpoints.low_water(str(tmp_path), 1) == 4000  # (the changes left out)
    checkpointed(rec, [Mark(5000, 1.0)], heard)
    saved = json.loads((tmp_path / "checkpoint-0.json").read_text())
    assert saved["low_water"] == 5000 and saved["id"] and saved["partitions"][0][2]["frontier"] == 9
    assert not (tmp_path / "checkpoint-0.changes.json").exists()


def test_a_checkpoint_looks_only_at_the_partitions_touched_and_at_every_one_now_and_then(
        tmp_path):
    rec, state, _ = recovery(tmp_path, held=True)
    for p in range(100):
        state(f"t{p // 5}", p % 5, NO_INCARNATION).frontier = p
    checkpointed(rec)  # (the first of a start: every partition, whole)
    changes = tmp_path / "checkpoint-0.changes.json"
    state("t1", 1, NO_INCARNATION).frontier = 500
    rec.held.touched(("t1", 1))  # (as the writer does for what it offers, claims, expires)
    state("t2", 2, NO_INCARNATION).frontier = 600  # (changed behind the writer's back)
    checkpointed(rec)
    assert [e[:2] for e in json.loads(changes.read_text())["partitions"]] == [["t1", 1]]
    checkpointed(rec)
    assert rec.metrics.get("checkpoints") == 2  # (nothing touched since: not even looked at)
    rec.look_all_at = 0.0  # (WHOLE_LOOK_SECONDS later: every state compared again)
    checkpointed(rec)
    assert rec.metrics.get("checkpoints") == 3
    assert [e[:2] for e in json.loads(changes.read_text())["partitions"]] == \
        [["t1", 1], ["t2", 2]]
