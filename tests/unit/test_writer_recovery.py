"""The writer's recovery room (diode.writer.recovery): a checkpoint is saved only once the
destination has acknowledged everything, and a restarted writer gets its partitions back from
it, tickets included; what waits for the destination's holdings is asked of once and handed
back in its order, the frontier raised to what the destination holds."""

import time

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.kafka.preparer import HoldingsAnswer
from diode.link.records import NO_INCARNATION
from diode.runtime.messages import Mark
from diode.writer.recovery import Recovery
from tests.unit.writer_fakes import LOG, metrics, run, settings


def recovery(tmp_path, resuming=False):
    sources, asked = {}, []

    def state(topic, partition, incarnation, now=None):
        source = sources.setdefault((topic, partition), SourcePartition())
        if source.current is None:
            source.current = PartitionState(0.0, incarnation=incarnation)
        return source.current

    rec = Recovery(settings(**{"missing.records.topic": "missing"}), metrics(), LOG, tmp_path,
                   0, 1, sources=sources, source_partitions={"t": 2},
                   owns=lambda t, p: True, name_of=lambda t: "dst_" + t, state=state,
                   ask_holdings=lambda *a: asked.append(a), resuming=resuming)
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
    assert len(asked) == 1  # (once per topic, for every partition of it this writer owns)
    topic, destination, wanted, missing_topic, _ = asked[0]
    assert (topic, destination, missing_topic) == ("t", "dst_t", "missing")
    assert wanted == {("t", 0, NO_INCARNATION), ("t", 1, NO_INCARNATION)}
    ready = rec.recovered_by(HoldingsAnswer("t", frozenset(wanted), {key: 0}, {}, None), 0.0)
    assert ready == [first, second] and rec.recover(*key)
    assert state(*key).frontier == 0  # the destination holds offset 0: not written again


def test_a_destination_that_cannot_be_read_is_asked_again_later(tmp_path):
    rec, _, asked = recovery(tmp_path)
    key = ("t", 0, NO_INCARNATION)
    rec.recover(*key)
    rec.unrecovered["t"].append(run(0, 1))
    assert rec.recovered_by(HoldingsAnswer("t", frozenset(), {}, None, "down"), 0.0) == []
    rec.ask_again()
    assert len(asked) == 1 and rec.metrics.get("errors", reason="recovery") == 1
    rec.recover_at["t"] = 0.0  # (RECOVER_AGAIN_SECONDS later)
    rec.ask_again()
    assert len(asked) == 2
