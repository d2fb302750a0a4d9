"""The missing-range reporter: how a missing range, a late fill and a closed ticket are told.

Where a range is decided missing is NOT here: diode.accounting.ordering decides it (PartitionState
turns runs, heartbeats and the reader's clock into Updates: writes, Missing ranges, fills), and
opens and settles the resend tickets it keeps. The reasons, and what each means, are named once
in diode.accounting.reasons. This room tells what ordering decided, per incarnation of a source
partition:

- a missing range: logged ("missing t[p] offsets a..b (meaning)"), counted (missing_ranges,
  missing_records, the last hour's), written as a `missing` event (diode.kafka.messages) to
  receiver.missing.records.topic, and a resend ticket opened (diode.accounting.tickets);
- records filling a reported range: a `filled` event, once per step per run of offsets, and the
  tickets they complete closed;
- a range below the source's log start (expired), a record refused for good (refused): `missing`
  again, with that reason;
- a ticket closed (filled, expired, untracked): a `closed` event, counted and logged.

It owns the fills waiting for the step's end and the last hour's missing ranges; it does not own
the events' producer (it hands each event to `emit`: the destination's event queue), the
partitions' states, or the backlog (resent runs cut by ticket are returned, not queued).
"""

import time
from collections import deque
from typing import NamedTuple

from diode.accounting import reasons, tickets
from diode.kafka.messages import range_record, ticket_header
from diode.accounting.ranges import merge
from diode.kafka import identity


class Reported(NamedTuple):
    """A missing range reported, for the last hour's metrics."""
    when: float    # time.monotonic()
    records: int


class Reporter:
    def __init__(self, settings, metrics, log, emit):
        """`settings`: the receiver's (missing.records.topic); `emit(topic, key, value,
        headers)`: hands an event to its producer's queue."""
        self.r, self.metrics, self.log, self.emit = settings, metrics, log, emit
        self.recent_missing: deque = deque(maxlen=10_000)  # of Reported, this last hour
        self.fills: dict = {}  # (topic, partition, incarnation) -> offsets filled late, this step

    # -- what ordering decided ---------------------------------------------------------------

    def apply(self, topic: str, partition: int, state, u, wait: float | None = None) -> None:
        """An Update of a partition's state told: its missing ranges reported (tickets opened,
        before the writes: the last record before the gap), its fills kept for report_fills,
        and a widened reorder wait logged. The caller queues u.writes after this."""
        now_ms = int(time.time() * 1000)
        for m in u.missing:
            self.event("missing", topic, partition, m.first, m.last, m.reason,
                       state.incarnation, ticket=self.ticket(topic, partition, state, m.first,
                                                             m.last))
            if m.reason == reasons.SOURCE_RESET:  # (its incarnation is gone: nothing resends it)
                self.close_tickets(topic, partition, state,
                                   [tickets.Closed(m.first, m.last, now_ms, reasons.EXPIRED)])
            else:
                self.close_tickets(topic, partition, state,
                                   state.open_ticket(m.first, m.last, now_ms))
        if u.filled:  # reported per run of offsets, once per step (report_fills)
            self.fills.setdefault((topic, partition, state.incarnation), []).extend(u.filled)
        if wait is not None and state.wait > wait:
            self.metrics.inc("reorder_wait_widened")
            self.log.warning("%s[%d]: records arrive later than the reorder wait: now waiting "
                             "%.1f s before reporting a gap (receiver.reorder.wait.max.ms)",
                             topic, partition, state.wait)

    def report_fills(self, sources: dict) -> None:
        """The step's fills, as `filled` events per run of offsets; the tickets they complete
        closed (`sources`: (topic, partition) -> SourcePartition)."""
        for (topic, partition, incarnation), offsets in self.fills.items():
            source = sources.get((topic, partition))
            state = source.find(incarnation) if source is not None else None
            for first, last in merge([(o, o) for o in offsets]):
                self.event("filled", topic, partition, first, last, reasons.LATE, incarnation)
                if state is not None:
                    self.close_tickets(topic, partition, state, state.settle_tickets(first, last))
        self.fills.clear()

    def expired(self, topic: str, partition: int, first: int, last: int,
                incarnation: bytes, ticket: str | None) -> None:
        """Reported missing, and now below the source's log start: never to be resent. Said
        once more, with reason expired and the ticket it is part of (counted apart: these
        records were counted missing when first reported)."""
        self.metrics.inc("missing_expired_records", last - first + 1)
        self.log.warning("missing %s[%d] offsets %d..%d expired: the source no longer holds "
                         "them, they cannot be resent", topic, partition, first, last)
        self.publish("missing", topic, partition, first, last, reasons.EXPIRED, incarnation,
                     ticket=ticket)

    def refused(self, topic: str, partition: int, offset: int, error: str,
                incarnation: bytes | None) -> None:
        """A record the destination (and the dead-letter topic, if any) refused for good."""
        self.metrics.inc("refused_records")
        self.event("missing", topic, partition, offset, offset, reasons.refused(error),
                   incarnation, ticket=None)  # (a refused record is no ticket)

    # -- events ------------------------------------------------------------------------------

    def event(self, kind, topic, partition, first, last, reason,
              incarnation: bytes | None, **more) -> None:
        """A missing range (or a late record filling one) of an incarnation of a source
        partition: logged, counted, and written to the missing-records topic when there is
        one."""
        topic_id = identity.text(incarnation) if incarnation is not None else None
        if kind == "missing":
            self.metrics.inc("missing_ranges")
            self.metrics.inc("missing_records", last - first + 1)
            self.recent_missing.append(Reported(time.monotonic(), last - first + 1))
            self.log.warning("missing %s[%d] offsets %d..%d (%s)%s", topic, partition, first,
                             last, reasons.meaning(reason),
                             f", topic id {topic_id}" if reason == reasons.SOURCE_RESET else "")
        else:
            self.metrics.inc("late_records", last - first + 1)
            self.log.info("late records %s[%d]@%d..%d filled a missing range", topic, partition,
                          first, last)
        self.publish(kind, topic, partition, first, last, reason, incarnation, **more)

    def publish(self, kind, topic, partition, first, last, reason, incarnation,
                **more) -> None:
        """An event on the missing-records topic, when there is one (`more`: its ticket and, of
        a closed one, its state and times), as diode.kafka.messages defines it."""
        if self.r.missing_records_topic:
            self.emit(self.r.missing_records_topic, *range_record(
                kind, topic, partition, incarnation, first, last, reason,
                int(time.time() * 1000), **more), None)

    # -- resend tickets (diode.accounting.tickets) ---------------------------------------------

    @staticmethod
    def ticket(topic: str, partition: int, state, first: int, last: int) -> str:
        return tickets.ticket_id(identity.text(state.incarnation), topic, partition, first, last)

    def close_tickets(self, topic: str, partition: int, state, closed: list) -> None:
        """Tickets closed (tickets.Closed): counted, logged, and said on the missing-records
        topic."""
        now_ms = int(time.time() * 1000)
        for c in closed:
            tid = self.ticket(topic, partition, state, c.first, c.last)
            self.metrics.inc("tickets_closed", reason=c.how)
            if c.how == reasons.FILLED:
                self.metrics.inc("ticket_repair_seconds", max(0, now_ms - c.opened) / 1000)
            self.log.info("ticket %s (%s[%d] %d..%d) closed: %s after %.0f s", tid, topic,
                          partition, c.first, c.last, c.how, max(0, now_ms - c.opened) / 1000)
            self.publish("closed", topic, partition, c.first, c.last, c.how, state.incarnation,
                         ticket=tid, state=c.how, opened_at=c.opened, closed_at=now_ms)

    def cut_by_ticket(self, run, state) -> list:
        """A resent run as (part, extra headers), cut where the open ticket its records fill
        changes: each with the header naming that ticket (none for records of no ticket)."""
        if state is None or not state.tickets:
            return [(run, ())]
        parts, start, current = [], 0, None
        for i, offset in enumerate(run.offsets):
            t = state.ticket_at(offset)
            if i and t is not current:
                parts.append((start, i, current))
                start = i
            current = t
        parts.append((start, len(run), current))
        return [(run if (a, b) == (0, len(run)) else run.take(range(a, b)),
                 ticket_header(self.ticket(run.topic, run.partition, state, t.first, t.last))
                 if t else ())
                for a, b, t in parts]

    # -- metrics -----------------------------------------------------------------------------

    def export(self, tickets_open: int, oldest: int | None) -> None:
        """Once a second: the last hour's missing ranges, and the open tickets (`tickets_open`,
        the oldest opened at `oldest`, ms; None: none open; diode.writer.held)."""
        hour_ago = time.monotonic() - 3600
        while self.recent_missing and self.recent_missing[0].when < hour_ago:
            self.recent_missing.popleft()
        self.metrics.set("missing_ranges_last_hour", len(self.recent_missing))
        self.metrics.set("missing_records_last_hour", sum(r.records for r in self.recent_missing))
        now_ms = int(time.time() * 1000)
        self.metrics.set("tickets_open", tickets_open)
        self.metrics.set("ticket_oldest_age_seconds",
                         round(max(0, now_ms - oldest) / 1000, 3) if oldest is not None else 0)
