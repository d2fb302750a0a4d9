"""Writer 0's link watch (diode.writer.link_watch): a sender silent for three heartbeat
intervals, on the reader's clock, is reported once, and its return too; a sender that stopped
cleanly is not reported silent; each heartbeat is recorded unless events are behind."""

import json

from diode.writer.link_watch import LinkWatch
from tests.unit.writer_fakes import LOG, metrics, settings


def beat(seen: float, reader: int = 0, stopping: bool = False) -> dict:
    return {"seen": seen, "interval_ms": 1000, "session": "s", "reader": reader,
            "time_ms": 1000 * int(seen), "stopping": stopping,
            "partitions": [("t", 0, b"\0" * 16, 0, 9, 10, False)]}


def watch(waiting: int = 0):
    emitted = []
    w = LinkWatch(settings(**{"heartbeat.topic": "beats"}), metrics(), LOG,
                  lambda *record: emitted.append(record), lambda: waiting, 100)
    return w, emitted


def test_a_silent_link_is_reported_once_and_its_return_too():
    w, emitted = watch()
    w.beat(beat(10.0))
    w.check(12.9, stopping=False)
    assert w.metrics.get("link_silent") == 0
    w.check(13.5, stopping=False)
    w.check(20.0, stopping=False)
    assert w.metrics.get("link_silent") == 1 and w.metrics.get("link_heartbeat_age_seconds") == 10
    w.beat(beat(21.0))
    assert w.metrics.get("link_silent") == 0 and w.metrics.get("heartbeats") == 2
    [record] = {json.dumps(json.loads(v)["lastSent"]) for _, _, v, _ in emitted}
    assert json.loads(record)[0]["offset"] == 9


def test_a_sender_stopped_cleanly_is_not_reported_silent():
    w, _ = watch()
    w.beat(beat(10.0, reader=0, stopping=True))
    w.check(60.0, stopping=False)
    assert w.metrics.get("sender_stopped") == 1 and w.metrics.get("link_silent") == 0
    w.beat(beat(61.0))  # it is back
    w.check(70.0, stopping=False)
    assert w.metrics.get("sender_stopped") == 0 and w.metrics.get("link_silent") == 1


def test_heartbeats_are_not_recorded_while_events_are_behind():
    w, emitted = watch(waiting=50)
    w.beat(beat(1.0))
    assert emitted == [] and w.metrics.get("heartbeats") == 1
