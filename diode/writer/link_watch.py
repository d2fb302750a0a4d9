"""The link watch (writer 0): is the sender still talking?

The sender's heartbeats come to writer 0 (with the reader's clock when each was read). A link
silent for three heartbeat intervals, on that clock, is reported (link_silent, a warning), unless
the sender's readers said in their last heartbeats that they stopped cleanly (wire.FLAG_STOPPING:
logged once, as is the sender's return). Each heartbeat can be recorded in
receiver.heartbeat.topic (diode.kafka.messages.HEARTBEAT).

It owns the last heartbeat's time, the silence and the readers' stopping flags. It does not own
the heartbeats' claims on the partitions (the stage offers those to diode.accounting.ordering),
nor the events producer (it hands each record to `emit`, and asks `events_waiting()` first:
liveness is dropped rather than held while events are behind).
"""

import time
from typing import NamedTuple

from diode.kafka.messages import heartbeat_record


class ReaderBeat(NamedTuple):
    """The newest heartbeat of one of the sender's readers."""
    seen: float     # the reader's clock (this side's) when it was read
    stopping: bool  # it said it stops cleanly (wire.FLAG_STOPPING)


class LinkWatch:
    def __init__(self, settings, metrics, log, emit, events_waiting, max_events: int):
        """`settings`: the receiver's (heartbeat.topic); `emit(topic, key, value, headers)`
        queues a record for the events producer, `events_waiting()` says how many wait there;
        a heartbeat record is dropped once half of `max_events` wait."""
        self.r, self.metrics, self.log = settings, metrics, log
        self.emit, self.events_waiting, self.max_events = emit, events_waiting, max_events
        self.last_beat = None             # reader's clock when the last heartbeat came
        self.beat_interval = 1.0
        self.link_silent = False
        # the sender's readers: index -> (reader's clock, stopping) of its newest heartbeat;
        # the sender stopped cleanly when every one said it stops
        self.readers_stopping: dict = {}
        self.sender_stopped = False

    def beat(self, beat: dict) -> None:
        seen = beat["seen"]  # the reader's clock when it was read
        if self.link_silent:
            self.log.info("heartbeats again after %.0f s of silence", seen - self.last_beat)
            self.link_silent = False
            self.metrics.set("link_silent", 0)
        self.last_beat = max(seen, self.last_beat or seen)
        self.beat_interval = beat["interval_ms"] / 1000
        self.metrics.inc("heartbeats")
        self.sender_stopping(beat, seen)
        if self.r.heartbeat_topic and self.events_waiting() < self.max_events // 2:
            # (liveness, not data: dropped rather than holding input while events are behind)
            self.emit(self.r.heartbeat_topic, *heartbeat_record(
                beat["session"], beat.get("time_ms"), int(time.time() * 1000),
                beat.get("reader"), beat.get("cluster"), beat.get("counters", {}),
                beat["partitions"]), None)

    def sender_stopping(self, beat: dict, seen: float) -> None:
        """A clean stop of the sender (each of its readers' newest heartbeats marked stopping)
        is logged once, and no silent link is reported while it stays stopped; a heartbeat not
        so marked after it says the sender is back. A sender killed, or a link cut, sends no
        such heartbeat: the silence is reported."""
        reader = beat.get("reader")
        known = self.readers_stopping.get(reader)
        if known is None or seen >= known.seen:
            self.readers_stopping[reader] = ReaderBeat(seen, bool(beat.get("stopping")))
        stopped = all(r.stopping for r in self.readers_stopping.values())
        if stopped == self.sender_stopped:
            return
        self.sender_stopped = stopped
        self.metrics.set("sender_stopped", int(stopped))
        if stopped:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                               time.gmtime(beat.get("time_ms", 0) / 1000))
            self.log.info("the sender stopped (clean stop) at %s, by its clock: its readers' "
                          "last heartbeats said so; its silence is not reported while it stays "
                          "stopped", at)
        else:
            self.log.info("the sender is back: heartbeats again after its clean stop")

    def check(self, clock: float, stopping: bool) -> None:
        """At the reader's `clock` (a pipeline held up by the destination is not a silent link):
        the heartbeat's age, and a silence reported once (not while this writer stops)."""
        if self.last_beat is None:
            return
        self.metrics.set("link_heartbeat_age_seconds", round(clock - self.last_beat, 3))
        if not self.link_silent and not stopping and not self.sender_stopped and \
                clock - self.last_beat > 3 * self.beat_interval:
            self.link_silent = True
            self.metrics.set("link_silent", 1)
            self.log.warning("no heartbeat from the sender for %.0f s: the link, the sender or "
                             "its source cluster is down", clock - self.last_beat)
