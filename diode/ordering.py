"""Order, duplicates and exact gaps of one source partition, at the writer that owns it.

Offsets of a source partition are not contiguous (compaction, transaction markers), so the sender
tells the chain: every record carries the offset of the previous record it sent from the same
partition (`prev_offset`; -1 on the first record of a chain, after a sender start or rewind).
Heartbeats add, per partition, where the sender's chain started and the last offset it has sent.

From those, PartitionState keeps a *frontier*: every offset up to it is resolved, either written
or reported missing. A record whose predecessor has not arrived waits up to `wait` seconds (the
link may reorder); then the gap before it is reported missing, exactly: the offsets between the
frontier and its predecessor, inclusive, are records that were sent and never arrived (or do not
exist, which the chain rules out). A heartbeat that claims records the frontier has not reached
after `wait` reports the tail as missing the same way, so loss at the end and a dead link are
seen too. Records at or below the frontier are duplicates, unless they fall in a range reported
missing: then they fill it (late arrivals, operator resends) and the fill is reported.

A late arrival from the chain (not a resend) shows the wait was too short for this receiver (a
busy machine: two packers' datagrams cross different unpackers and queues): the wait becomes
twice what that record needed, up to `max_wait`, so a loaded receiver stops raising false
alarms after the first.

Memory is bounded: records waiting for a predecessor (`max_pending`; beyond it the oldest gap is
resolved at once), reported gaps remembered for late fills (`max_gaps`), heartbeat claims.
Pure logic, after MirrorMaker 2's PartitionState: no clock, no I/O.
"""

import bisect
import heapq
from collections import deque
from typing import NamedTuple

from diode.records import RESEND, Record


class Missing(NamedTuple):
    first: int
    last: int
    reason: str  # "gap": a later record arrived; "tail": a heartbeat said they were sent


class Update(NamedTuple):
    writes: list      # records to write now, in source order
    missing: list     # Missing ranges newly found
    filled: list      # offsets of records that filled a reported gap (written too)


def _key(r: Record) -> int:
    """The offset this record waits for: its predecessor, or for the first record of a chain
    the offset just before it (what an earlier chain must have sent up to)."""
    return r.prev_offset if r.prev_offset >= 0 else r.offset - 1


class PartitionState:
    def __init__(self, wait: float, max_pending: int = 100_000, max_gaps: int = 10_000,
                 frontier: int | None = None, max_wait: float | None = None):
        self.wait = wait
        self.max_wait = max(wait, max_wait if max_wait is not None else wait)
        self._now = 0.0
        self._reports: list = []  # (first, last, when, wait) of reported gaps, ascending
        self.max_pending = max_pending
        self.max_gaps = max_gaps
        self.frontier = frontier
        self.anchor: int | None = None     # where the sender's chain started (heartbeats)
        self.gaps: list = []               # sorted [first, last] reported missing
        # Offsets below where this receiver joined a running chain: not known written, not
        # reported missing (the first records of a chain may simply arrive late).
        self.unknown: list = []
        self.pending: dict = {}            # offset -> record waiting for its predecessor
        self._heap: list = []              # offsets in pending
        self._arrivals: deque = deque()    # (time, offset) in arrival order
        self._claims: deque = deque()      # (time, last sent offset), increasing
        self.duplicates = 0

    # -- input -------------------------------------------------------------------------------

    def offer(self, r: Record, now: float) -> Update:
        u = Update([], [], [])
        self._now = now
        if r.prev_offset == RESEND:
            # An operator's resend (`diode resend`): these records were found missing. One in a
            # reported gap fills it; any other is written as well, since this state may not
            # know the gap (a restarted receiver, a gap found by `diode verify`). It never moves
            # the frontier: the chain decides that.
            u.writes.append(r)
            if self.frontier is not None and r.offset <= self.frontier and \
                    self._fill(r.offset) == "gap":
                u.filled.append(r.offset)
            return u
        if self.frontier is None and r.prev_offset < 0:
            self.frontier = r.offset - 1  # a chain starts here: nothing expected before it
        if not self.pending and self.frontier is not None and \
                r.offset > self.frontier >= _key(r):
            u.writes.append(r)  # the common case: the next record of the chain, in order
            self.frontier = r.offset
            return u
        if self.frontier is not None and r.offset <= self.frontier:
            self._late(r, u)
            if u.filled:
                self._widen(now, u.filled)
            return u
        if r.offset in self.pending:
            self.duplicates += 1
            return u
        self.pending[r.offset] = r
        heapq.heappush(self._heap, r.offset)
        self._arrivals.append((now, r.offset))
        self._release(u)
        while len(self.pending) > self.max_pending:
            self._force(u)
        if u.filled:
            self._widen(now, u.filled)
        return u

    def heartbeat(self, chain_start: int, last_sent: int, now: float) -> None:
        """The sender's chain for this partition started at `chain_start` and has sent every
        record up to `last_sent`."""
        if self.frontier is None:
            self.anchor = chain_start
        if (self.frontier is None or last_sent > self.frontier) and \
                (not self._claims or last_sent > self._claims[-1][1]):
            self._claims.append((now, last_sent))

    def expire(self, now: float) -> Update:
        """Resolve what has waited `wait` seconds: gaps before waiting records, claimed tails."""
        u = Update([], [], [])
        self._now = now
        while self.pending:
            while self._arrivals and self._arrivals[0][1] not in self.pending:
                self._arrivals.popleft()
            if now - self._arrivals[0][0] < self.wait:
                break
            self._force(u)
        while self._claims and now - self._claims[0][0] >= self.wait:
            _, last = self._claims.popleft()
            while self._heap and self._heap[0] <= last:
                self._force(u)
            self._anchor()
            if self.frontier is not None and last > self.frontier:
                self._report(Missing(self.frontier + 1, last, "tail"), u)
                self.frontier = last
                self._release(u)
        if u.filled:
            self._widen(now, u.filled)
        return u

    @property
    def busy(self) -> bool:
        """Whether expire() may have something to do."""
        return bool(self.pending or self._claims)

    # -- internals ---------------------------------------------------------------------------

    def _release(self, u: Update) -> None:
        """Write waiting records whose predecessor is resolved, in offset order."""
        while self._heap and self.frontier is not None:
            offset = self._heap[0]
            r = self.pending[offset]
            if offset <= self.frontier:  # resolved meanwhile (a gap report ran past it)
                heapq.heappop(self._heap)
                del self.pending[offset]
                self._late(r, u)
            elif _key(r) <= self.frontier:
                heapq.heappop(self._heap)
                del self.pending[offset]
                u.writes.append(r)
                self.frontier = offset
            else:
                break

    def _force(self, u: Update) -> None:
        """The lowest waiting record waited long enough: report the gap before it, write it."""
        r = self.pending[self._heap[0]]
        need = _key(r)
        if self.frontier is None:
            self._anchor()
        if self.frontier is None:
            # Joined a running chain (or its start is late): nothing is reported before it,
            # and what comes from there later is written, not taken for a duplicate.
            self.frontier = need
            self.unknown = [[0, need]] if need >= 0 else []
        elif need > self.frontier:
            self._report(Missing(self.frontier + 1, need, "gap"), u)
            self.frontier = need
        self._release(u)

    def _widen(self, now: float, filled: list) -> None:
        """Gaps reported too early were filled by the chain: wait longer (see the module)."""
        if self.wait >= self.max_wait:
            return
        # gaps are reported in offset order, so the lowest offset filled waited longest
        offset = min(filled)
        i = bisect.bisect_right(self._reports, (offset, float("inf"))) - 1
        if i >= 0 and self._reports[i][1] >= offset:
            _, _, when, waited = self._reports[i]
            late = now - when + waited  # how long it really took
            self.wait = min(self.max_wait, max(self.wait, 2 * late))

    def _anchor(self) -> None:
        if self.frontier is None and self.anchor is not None:
            self.frontier = self.anchor - 1

    def _report(self, m: Missing, u: Update) -> None:
        u.missing.append(m)
        self._reports.append((m.first, m.last, self._now, self.wait))
        if len(self._reports) > self.max_gaps:
            del self._reports[0]
        self.gaps.append([m.first, m.last])  # always above earlier gaps: the frontier only rises
        if len(self.gaps) > self.max_gaps:
            del self.gaps[0]

    def _late(self, r: Record, u: Update) -> None:
        """A record at or below the frontier: fills a gap, or is a duplicate."""
        kind = self._fill(r.offset)
        if kind is None:
            self.duplicates += 1
            return
        u.writes.append(r)
        if kind == "gap":
            u.filled.append(r.offset)

    def _fill(self, offset: int) -> str | None:
        """Take `offset` out of the reported gaps ("gap") or the unknown range ("unknown");
        None if it was in neither (a duplicate)."""
        for kind, ranges in (("gap", self.gaps), ("unknown", self.unknown)):
            i = bisect.bisect_right(ranges, [offset, float("inf")]) - 1
            if i >= 0 and ranges[i][0] <= offset <= ranges[i][1]:
                first, last = ranges[i]
                ranges[i:i + 1] = [p for p in ([first, offset - 1], [offset + 1, last])
                                   if p[0] <= p[1]]
                return kind
        return None
