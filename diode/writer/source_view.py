"""The source view: the source cluster as the sender's readers look at it, seen from here.

Every writer keeps, for the partitions it owns, the sender's newest look at each (its
incarnation, log start and end: wire.KIND_SOURCE) and each topic's retention, and exports per
source topic the records its source holds, the lag (not yet written here or reported missing)
and the missing records at risk (source_lag_records, source_held_records,
missing_at_risk_records). A log start that passed a reported range makes it expired (told by
the reporter). The sender's digests of what it read go to receiver.digest.topic (diode verify);
a resend's digests say how many records the source holds in a resent range, which fills its
ticket once they have arrived. Writer 0 (the one with a MetadataSync) also keeps the source's
metadata, newest per topic and group partition, and hands it to the sync (diode.kafka.metasync).

It owns those looks and that metadata. It does not own the partitions' states (it reads the
writer's `sources`), the tickets' reports (diode.writer.reporter), nor the events producer (it
hands digests to `emit`).
"""

import time
from typing import NamedTuple

from diode.kafka.messages import digest_record
from diode.writer.destination import MAX_PARTITIONS


class SourceLook(NamedTuple):
    """A source partition as the sender's reader last looked at it (wire.KIND_SOURCE)."""
    incarnation: bytes  # its topic id
    log_start: int      # the first offset the source still holds
    end: int            # the offset after its last record
    time_ms: int        # when the reader looked (sender time)


class Share(NamedTuple):
    """What one source partition adds to its topic's gauges (SourceView.export)."""
    lag: int    # records its source holds past what was written here or reported missing
    held: int   # records its source holds (end - log start)
    risk: int   # records reported missing that the source deletes next


class Lag:
    """A source topic's sums over the partitions counted (SourceView.export)."""
    __slots__ = ("partitions", "lag", "held", "risk", "exported")

    def __init__(self):
        self.partitions = self.lag = self.held = self.risk = 0
        self.exported = False  # its gauges were set (set to 0 when no partition counts)

    def add(self, share: Share) -> None:
        self.partitions += 1
        self.lag, self.held, self.risk = (self.lag + share.lag, self.held + share.held,
                                          self.risk + share.risk)

    def take(self, share: Share) -> None:
        self.partitions -= 1
        self.lag, self.held, self.risk = (self.lag - share.lag, self.held - share.held,
                                          self.risk - share.risk)


class TopicSettings(NamedTuple):
    """A source topic's retention, as the sender last read it (-1: none)."""
    retention_ms: int
    retention_bytes: int
    policy: str         # cleanup.policy


class SourceView:
    def __init__(self, settings, metrics, log, *, sources: dict, owns, reporter, emit,
                 sync=None, touched=lambda tp: None, changed=None):
        """`settings`: the receiver's; `sources`: (topic, partition) -> SourcePartition, the
        writer's; `owns(topic, partition)`; `reporter`: the writer's Reporter; `emit(topic,
        key, value, headers)`: to the events producer; `sync`: writer 0's MetadataSync;
        `touched(tp)`: a partition's tickets or log start changed here (diode.writer.held);
        `changed()`: the partitions whose states changed since it was last called
        (diode.writer.held's take_changed; None: every partition is counted again at every
        export)."""
        self.r, self.metrics, self.log = settings, metrics, log
        self.sources, self.owns, self.reporter, self.emit = sources, owns, reporter, emit
        self.sync = sync
        self.touched = touched
        self.changed = changed
        # the source as the sender last looked at it (wire.KIND_SOURCE): (topic, partition) ->
        # (incarnation, log start, end, sender time), topic -> (retention.ms, .bytes, policy)
        self.source_state: dict = {}
        self.topic_settings: dict = {}
        # What export() counted, kept so that it counts again only what changed (issue 36: it
        # walked every partition each second): (topic, partition) -> Share, of the partitions
        # counted (a look at another incarnation than the one written counts for none);
        # topic -> Lag, their sums; the partitions whose look changed since (`looked`) and
        # those with open tickets, whose records at risk change with the time (`ticketed`).
        self.shares: dict = {}
        self.lags: dict = {}
        self.looked: set = set()
        self.ticketed: set = set()
        self.meta_times: dict = {}    # source topic or (group, topic, partition) -> the time
        #                               of the newest metadata taken for it
        self.meta_topics: dict = {}   # source topic -> its metadata, not yet applied
        self.meta_groups: dict = {}   # (group, topic, partition) -> (incarnation, offset), same

    def source(self, state: dict) -> None:
        """A reader's look at its source: the partitions this writer owns, newest look kept."""
        for topic, partition, incarnation, log_start, end in state["partitions"]:
            key = (topic, partition)
            known = self.source_state.get(key)
            if not self.owns(topic, partition) or (known and known.time_ms > state["time_ms"]):
                continue
            if known is None and len(self.source_state) >= MAX_PARTITIONS:
                continue  # (bounded, as the partitions' states are)
            self.source_state[key] = SourceLook(incarnation, log_start, end, state["time_ms"])
            if known is None or known[:3] != (incarnation, log_start, end):
                self.looked.add(key)  # (counted again by the next export)
            source = self.sources.get(key)
            held = source.find(incarnation) if source is not None else None
            if held is not None and (held.gaps or log_start > held.log_start):
                self.touched(key)  # (its tickets, or its log start, which its checkpoint holds)
            for first, last in held.source_starts(log_start) if held is not None else ():
                ticket = held.ticket_at(first)
                self.reporter.expired(topic, partition, first, last, incarnation,
                                      ticket=self.reporter.ticket(
                                          topic, partition, held, ticket.first, ticket.last)
                                      if ticket else None)
                self.reporter.close_tickets(topic, partition, held,
                                            held.settle_tickets(first, last))
        for topic, retention_ms, retention_bytes, policy in state["topics"]:
            if topic in self.topic_settings or len(self.topic_settings) < MAX_PARTITIONS:
                self.topic_settings[topic] = TopicSettings(retention_ms, retention_bytes, policy)

    def export(self) -> None:
        """Per source topic: the records its source holds (end - log start) and those not yet
        written here or reported missing (end - 1 - how far this writer has come: the lag),
        over the partitions this writer owns, of their current incarnations. Counted again
        only for the partitions whose look or states changed since the last export, or that
        have tickets open (their records at risk come due with the time); a topic's gauges
        are set when its sums change (a topic no partition counts for any more: its lag and
        records at risk set to 0)."""
        margin = self.r.resend_margin_records
        horizon = int(time.time() * 1000 + self.r.resend_horizon_ms)
        if self.changed is None:
            again = set(self.source_state)
        else:
            again = self.looked | self.ticketed | self.changed()
        self.looked = set()
        shares, lags, moved = self.shares, self.lags, set()
        for key in again:
            look = self.source_state.get(key)
            new = self._share(key, look, margin, horizon) if look is not None else None
            old = shares.get(key)
            if new == old:
                continue
            topic = key[0]
            lag = lags.get(topic)
            if lag is None:
                lag = lags[topic] = Lag()
            if old is not None:
                lag.take(old)
            if new is None:
                del shares[key]
            else:
                shares[key] = new
                lag.add(new)
            moved.add(topic)
        for topic in moved:
            lag = lags[topic]
            if lag.partitions == 0:
                del lags[topic]
                if lag.exported:
                    for name in ("source_lag_records", "missing_at_risk_records"):
                        self.metrics.set(name, 0, topic=topic)
                continue
            self.metrics.set("source_lag_records", lag.lag, topic=topic)
            self.metrics.set("source_held_records", lag.held, topic=topic)
            self.metrics.set("missing_at_risk_records", lag.risk, topic=topic)
            lag.exported = True

    def _share(self, key: tuple, look: SourceLook, margin: int, horizon: int):
        """What a partition adds to its topic's sums (Share), None when its look is of
        another incarnation than the one written; kept in `ticketed` while it has tickets."""
        inc, log_start, end, _ = look
        source = self.sources.get(key)
        state = source.current if source is not None else None
        if state is not None and state.incarnation != inc:
            self.ticketed.discard(key)
            return None  # (a look at another incarnation than the one written)
        done = state.frontier if state is not None else log_start - 1
        done = log_start - 1 if done is None else done
        risk = 0
        if state is not None:
            if state.tickets:
                self.ticketed.add(key)
                known = self.topic_settings.get(key[0])
                retention_ms = known.retention_ms if known is not None else -1
                due = state.due_by(horizon, retention_ms) if retention_ms >= 0 else ()
            else:
                self.ticketed.discard(key)
                due = ()
            risk = state.at_risk(margin, due)
        else:
            self.ticketed.discard(key)
        return Share(max(0, end - 1 - max(done, log_start - 1)), max(0, end - log_start), risk)

    def digests(self, batch: dict) -> None:
        """The sender's digests of ranges it read (diode.accounting.digests): to
        receiver.digest.topic, for diode verify. A resend's say how many records the source
        holds in each range it resent: its ticket is filled once they have all arrived."""
        if batch.get("resend"):
            for t, p, inc, first, last, count, _ in batch["partitions"]:
                source = self.sources.get((t, p))
                state = source.find(inc) if source is not None else None
                if state is not None:
                    self.touched((t, p))
                    state.source_holds(first, last, count)
                    self.reporter.close_tickets(t, p, state, state.settle_tickets(first, last))
        topic = self.r.digest_topic
        if not topic:
            return
        for t, p, inc, first, last, count, digest in batch["partitions"]:
            self.emit(topic, *digest_record(
                t, p, inc, first, last, count, digest, batch["time_ms"], batch["cluster"],
                bool(batch.get("resend"))), None)
        self.metrics.inc("digests", len(batch["partitions"]))

    # -- the source's metadata (writer 0) ------------------------------------------------------

    def metadata(self, meta: dict) -> None:
        """The source's metadata (writer 0): kept, newest per topic and group partition (a
        journal replay brings older looks again), until the MetadataSync takes it."""
        if self.sync is None:
            return
        when = meta["time_ms"]
        for topic, *entry in meta["topics"]:
            if self._newer(topic, when):
                self.meta_topics[topic] = tuple(entry)
        for group, topic, partition, incarnation, offset in meta["groups"]:
            if self._newer((group, topic, partition), when):
                self.meta_groups[(group, topic, partition)] = (incarnation, offset)
        self.hand()

    def _newer(self, key, when: int) -> bool:
        if self.meta_times.get(key, -1) > when:
            return False
        if key not in self.meta_times and len(self.meta_times) >= MAX_PARTITIONS:
            return False  # (bounded: as many topics and group partitions as partitions)
        self.meta_times[key] = when
        return True

    def hand(self) -> None:
        """Take the MetadataSync's reports; hand it what waits once it is done."""
        for report in self.sync.take():
            self._synced(report)
        if not self.sync.busy and (self.meta_topics or self.meta_groups):
            self.sync.hand(self.meta_topics, self.meta_groups)
            self.meta_topics, self.meta_groups = {}, {}

    def _synced(self, report) -> None:
        what = "source topic" if report.kind == "topic" else "consumer group"
        if report.error is not None:
            self.log.warning("cannot apply the metadata of %s %s to the destination: %s "
                             "(the sender sends it again)", what, report.name, report.error)
            self.metrics.inc("errors", reason="metadata")
            return
        for reason, text in report.done:
            self.log.info("metadata of %s %s: %s", what, report.name, text)
            self.metrics.inc("metadata_changes", reason=reason)
        for reason, text in report.refused:
            self.log.warning("metadata of %s %s: %s", what, report.name, text)
            self.metrics.inc("metadata_refused", reason=reason)
        if not report.at:
            return  # (nothing applied yet: waits for records to translate by)
        if report.kind == "topic":
            self.metrics.set("metadata_synced_timestamp_seconds", report.at,
                             topic=report.name)
        else:
            self.metrics.set("group_synced_timestamp_seconds", report.at, group=report.name)
