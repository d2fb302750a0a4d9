"""Order, duplicates and exact gaps of one source partition, at the writer that owns it.

This is where a range of source offsets is decided missing, and the only place: the writer's
reporter (diode.writer.reporter) tells what is decided here (events, logs, metrics), and every
reason is named once in diode.accounting.reasons. Resend tickets are opened and settled here
too, kept in diode.accounting.tickets.OpenTickets.

Offsets of a source partition are not contiguous (compaction, transaction markers), so the sender
tells the chain: records travel in runs (diode.link.runs) of consecutive records of the chain, and
each run carries the offset of the record the sender sent before its first (`prev`; -1 when the run
starts a chain, after a sender start or rewind). State is kept per run, not per record: a run
that continues the chain is written whole; only runs that overlap what is already resolved are
cut, by offset.
Heartbeats add, per partition, where the sender's chain started and the last offset it has sent.

From those, PartitionState keeps a *frontier*: every offset up to it is resolved, either written
or reported missing. A record whose predecessor has not arrived waits up to `wait` seconds (the
link may reorder); then the gap before it is reported missing, exactly: the offsets between the
frontier and its predecessor, inclusive, are records that were sent and never arrived (or do not
exist, which the chain rules out). A heartbeat that claims records the frontier has not reached
after `wait` reports the tail as missing the same way, so loss at the end and a dead link are
seen too. Records at or below the frontier are duplicates, unless they fall in a range reported
missing: then they fill it (late arrivals, operator resends) and the fill is reported.

Where a chain starts. A chain's first run may be lost, so what the receiver first hears of a chain
may be a later run or a heartbeat; heartbeats name where the chain started. A chain this receiver
*saw start* is accounted from its first offset, in whatever order its runs and heartbeats arrive:
what of it has not arrived when a heartbeat naming its start has waited `wait` is reported
missing ("gap"), even after a later run was written (the head then waits in `unknown`, below the
frontier, until a heartbeat accounts it). A chain this receiver joined while it ran (a receiver
started after the sender) is accounted from the first record or tail it resolves: nothing before
it is reported. The rule that tells them apart: a receiver saw a chain start when it heard a
heartbeat of the chain's reader sent before the first heartbeat naming that chain (each reader
names a chain from its first heartbeat after the chain's first record was sent, and sends one
before it reads anything). Each claim says when its chain was first named: the sender time of
the first heartbeat its reader handed on that carried it (diode.kafka.claims; the same for the
chain's current and retired claims), which the writer passes as `sent`, with the earliest sender
time it has heard of the same reader (`heard`, this heartbeat's own included, kept across
restarts in its checkpoints); a state keeps, per chain start, the earliest of each (`chains`),
and a chain is seen start when the earliest heard is before the earliest naming it. So a
receiver running before the sender started, or before a partition, topic or rewind started a
chain, accounts it; one first started while a chain was running does not, whether the first
heartbeat it hears names the chain or, with sender.heartbeat.claims.max, one K heartbeats later
does (it says the chain was named before); one restarted accounts a chain that started while it
was down, as "receiver-down" (below). A heartbeat of an older sender does not say when a chain
was first named: its own time stands for it, which is exact only when every heartbeat names
every chain (claims.max 0, all such a sender has).

With claims.max, a heartbeat names the partitions whose claim changed and a slice of the others,
each at least every K heartbeats, and the receiver acts on the claims it hears; a partition a
heartbeat leaves out is not taken as gone. What that changes here: a tail lost with the
heartbeat that claimed it (the chain then idle) is reported when the claim comes round again,
up to K heartbeats later (plus `wait`); a restarted receiver learns of an idle partition's
records sent while it was down within K heartbeats, and reports them "receiver-down" as before
(resumed ends with a live record, not with a claim); a retired incarnation's claim is new when
it retires, so it is named at once, and again every K heartbeats for a day; the link watch
counts heartbeats, not claims, and the stopping heartbeats name every claim.

A late arrival from the chain (not a resend) shows the wait was too short for this receiver (a
busy machine: two packers' datagrams cross different unpackers and queues): the wait becomes
twice what that record needed, up to `max_wait`, so a loaded receiver stops raising false
alarms after the first.

After a restart the state comes back from the writer's checkpoint (or from the destination's
provenance headers) with `resumed` set, and so does a partition first seen by a restarted
receiver. Until live traffic (not the journal's replay of what arrived before) writes a record of
the partition, what it shows missing was sent while no receiver was reading, and is reported with
the reason "receiver-down": the gap before the first live record, and every tail the sender's
heartbeats claim before it (a heartbeat claims what the sender handed to its kernel, which it may
learn after the restart of records it sent before). The same holds when the first live record
joins a chain whose start no heartbeat has named yet, and the heartbeat that does comes after
the record was written: the head it accounts was sent while no receiver read (`down_to`).

Offsets mean something only within one incarnation of a source partition (a topic deleted and
recreated starts again at 0; diode.kafka.identity), so a state belongs to one incarnation and a
writer keeps one per incarnation it hears of (SourcePartition). When a newer incarnation appears,
the old one *retires*: it keeps taking its own late records for `wait` seconds, then what is still
open (gaps waiting for a predecessor, tails claimed and not arrived, and the records its source
held that the sender never read, up to the end the sender last saw) is reported once with the
reason "source-reset". A retired state stays, so that copies of its records (a journal replay, a
late datagram) are still told apart from records of the new incarnation.

Memory is bounded: records waiting for a predecessor (`max_pending`, counted in records; beyond
it the oldest gap is resolved at once), reported gaps remembered for late fills (`max_gaps`),
heartbeat claims.
Pure logic, after MirrorMaker 2's PartitionState: no clock, no I/O.
"""

import bisect
import heapq
from collections import deque
from typing import NamedTuple

from diode.accounting import reasons
from diode.accounting.tickets import Open, OpenTickets
from diode.link.records import NO_INCARNATION


class Missing(NamedTuple):
    first: int
    last: int
    reason: str  # diode.accounting.reasons: GAP, TAIL, RECEIVER_DOWN or SOURCE_RESET


CHECKPOINT_GAPS = 1000  # reported gaps a checkpoint keeps for late fills
MAX_RETIRED = 4         # retired incarnations kept per source partition (each a few numbers)
MAX_CHAINS = 4          # chain starts a state remembers what heartbeats said of (the newest)


class Claim(NamedTuple):
    """A heartbeat's word, waiting `wait` before it is acted on."""
    time: float       # the reader's clock when it came
    start: int        # where the sender's chain started
    last: int         # the last offset the chain has sent
    live: bool        # not replayed from the journal


class ChainHeard(NamedTuple):
    """What heartbeats said of when a chain started (sender times, ms; None: not said, this
    receiver saw it start): seen start when the reader was heard before the chain was named."""
    named: int | None   # the earliest heartbeat naming the chain
    heard: int | None   # the earliest heartbeat of its reader heard


class Arrival(NamedTuple):
    """A run that came and waits for its predecessor."""
    time: float   # the reader's clock when it came
    key: int      # the offset it waits for (_key), its key in `pending`


class Update(NamedTuple):
    writes: list      # runs to write now, in source order (a fill may come after later runs)
    missing: list     # Missing ranges newly found
    filled: list      # offsets of records that filled a reported gap (written too)


def _key(run) -> int:
    """The offset a run waits for: its predecessor, or for a run that starts a chain the offset
    just before it (what an earlier chain must have sent up to)."""
    return run.prev if run.prev >= 0 else run.offsets[0] - 1


def _tail(run, i: int):
    """The run's records from index i on."""
    return run if i == 0 else run.take(range(i, len(run)))


class PartitionState:
    def __init__(self, wait: float, max_pending: int = 100_000, max_gaps: int = 10_000,
                 frontier: int | None = None, max_wait: float | None = None,
                 resumed: bool = False, incarnation: bytes = NO_INCARNATION):
        self.incarnation = incarnation     # of the source partition: its topic id
        # Retirement (see the module): the reader's clock when a newer incarnation appeared
        # (what is open is reported after `wait`), then retired for good.
        self.retiring: float | None = None
        self.retired = False
        self.source_end = -1               # the last offset its source held (the sender's word)
        self.log_start = 0                 # the first its source still holds (ditto): gaps
        #                                    below it were reported expired
        self._resetting = False            # reporting what a retirement leaves open
        self.wait = wait
        self.max_wait = max(wait, max_wait if max_wait is not None else wait)
        self._now = 0.0
        self._reports: list = []  # (first, last, when, wait) of reported gaps, ascending
        self.max_pending = max_pending
        self.max_gaps = max_gaps
        self.frontier = frontier
        self.anchor: int | None = None     # where the sender's chain started (heartbeats)
        # Per chain start heard of (at most MAX_CHAINS, the newest last): [the earliest sender
        # time of a heartbeat naming it, the earliest of a heartbeat of its reader heard]
        # (None, None: the caller did not say; taken as seen start). See the module.
        self.chains: dict = {}
        self.gaps: list = []               # sorted [first, last] reported missing
        # Offsets below where this receiver first heard of the partition (a running chain, or
        # a chain start): not known written, not reported missing (the first records of a
        # chain, or an earlier chain's last, may simply arrive late: they are written).
        self.unknown: list = []
        # Parts of `unknown` that a late run of an earlier chain showed were sent: the chain
        # continued from that run's predecessor up to where this receiver joined (a sender
        # restarts from its committed offsets, which never pass what it sent). [first, last,
        # since]: reported missing unless filled within `wait` of `since`.
        self.expected: list = []
        self.pending: dict = {}            # first offset -> run waiting for its predecessor
        self.pending_records = 0
        self._heap: list = []              # first offsets in pending
        self._arrivals: deque = deque()    # of Arrival, in arrival order
        self._claims: deque = deque()      # Claims, last sent increasing within a chain
        self.duplicates = 0
        self.resumed = resumed             # after a restart, no live record written yet
        # After a restart, the first live record joined a chain this receiver had not heard
        # start: what a heartbeat later shows missing up to here was sent while no receiver
        # read, as if the heartbeat had come first (-1: none such).
        self.down_to = -1
        # Open resend tickets: reported ranges, sorted and disjoint, until no gap is left in
        # them (or none the source holds).
        self.tickets = OpenTickets()
        self.last_timestamp: int | None = None  # of the last record written (the caller's)

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self) -> dict:
        """What a restart needs: the frontier and the ranges late records may still fill (the
        caller adds the incarnation, in text)."""
        return {"frontier": self.frontier, "gaps": self.gaps[-CHECKPOINT_GAPS:],
                "unknown": self.unknown[-CHECKPOINT_GAPS:], "wait": self.wait,
                "expected": [[first, last] for first, last, _ in self.expected],
                "retired": self.retired, "retiring": self.retiring is not None,
                "source_end": self.source_end, "log_start": self.log_start,
                "tickets": [t.as_list() for t in self.tickets[-CHECKPOINT_GAPS:]],
                "last_timestamp": self.last_timestamp,
                "chains": [[start, *known] for start, known in self.chains.items()],
                "down_to": self.down_to}

    @classmethod
    def restore(cls, saved: dict, wait: float, max_wait: float | None = None,
                incarnation: bytes = NO_INCARNATION, **limits) -> "PartitionState":
        state = cls(max(wait, saved.get("wait", wait)), frontier=saved["frontier"],
                    max_wait=max_wait, incarnation=incarnation, **limits)
        state.retired = bool(saved.get("retired"))
        state.source_end = int(saved.get("source_end", -1))
        state.log_start = int(saved.get("log_start", 0))
        if saved.get("retiring") and not state.retired:
            state.retiring = -1.0  # the wait starts again at the first expire() (the reader
            #                        clock it ran on went with the restart)
        state.gaps = [list(g) for g in saved.get("gaps", [])]
        state.unknown = [list(g) for g in saved.get("unknown", [])]
        state.tickets = OpenTickets(Open.of_list(t) for t in saved.get("tickets", []))
        state.last_timestamp = saved.get("last_timestamp")
        state.chains = {start: ChainHeard(named, heard)
                        for start, named, heard in saved.get("chains", [])}
        # the wait starts again at the first expire() after the restart
        state.expected = [[first, last, None] for first, last in saved.get("expected", [])]
        state.resumed = True
        state.down_to = int(saved.get("down_to", -1))
        return state

    def written_up_to(self, offset: int) -> None:
        """The destination already holds this partition's records up to `offset` (recovered
        from provenance headers): they are resolved, and none of them is reported missing."""
        if self.frontier is None or offset > self.frontier:
            self.frontier = offset
            self.resumed = True

    def reported(self, ranges: list) -> None:
        """Missing ranges already reported before a restart: not reported again, and late
        records may fill them."""
        for first, last in ranges:
            if not self._overlaps(self.gaps, first, last):
                bisect.insort(self.gaps, [first, last])
            self.written_up_to(last)

    def source_starts(self, log_start: int) -> list:
        """The source now holds this partition from `log_start` on: the parts of the reported
        gaps below it that were not below its last log start, [first, last] ascending. They
        can never be resent (they stay fillable: a record already on its way may still come)."""
        if log_start <= self.log_start:
            return []
        floor, self.log_start = self.log_start, log_start
        return [[max(first, floor), min(last, log_start - 1)] for first, last in self.gaps
                if first < log_start and last >= floor]

    def at_risk(self, margin: int, due: list = ()) -> int:
        """Records of the reported gaps that the source holds and will delete first: those less
        than `margin` offsets above its log start, and those in the ranges `due` (due_by)."""
        if not self.gaps:
            return 0  # (the common case: nothing reported missing)
        top, n = self.log_start + margin - 1, 0
        i = max(0, bisect.bisect_left(self.gaps, [self.log_start]) - 1)
        while i < len(self.gaps) and self.gaps[i][0] <= top:
            first, last = self.gaps[i]
            if last >= self.log_start:
                n += min(last, top) - max(first, self.log_start) + 1
            i += 1
        for first, last in due:  # (above the margin: counted once)
            lo = max(first, top + 1)
            j = max(0, bisect.bisect_left(self.gaps, [lo]) - 1)
            while j < len(self.gaps) and self.gaps[j][0] <= last:
                a, b = max(self.gaps[j][0], lo), min(self.gaps[j][1], last)
                n += max(0, b - a + 1)
                j += 1
        return n

    # -- tickets (diode.accounting.tickets.OpenTickets) ----------------------------------------

    def open_ticket(self, first: int, last: int, now_ms: int) -> list:
        """A reported missing range is a ticket from now on (OpenTickets.open), with the
        timestamp of the last record written before it; at most `max_gaps` stay open."""
        return self.tickets.open(first, last, now_ms, self.last_timestamp, self.max_gaps)

    def settle_tickets(self, first: int, last: int) -> list:
        """The tickets overlapping [first, last] that are done, closed (OpenTickets.settle)."""
        return self.tickets.settle(first, last, self.gaps, self.log_start)

    def ticket_at(self, offset: int) -> Open | None:
        return self.tickets.at(offset)

    def source_holds(self, first: int, last: int, count: int) -> None:
        self.tickets.holds(first, last, count)

    def due_by(self, deadline_ms: int, retention_ms: int) -> list:
        return self.tickets.due_by(deadline_ms, retention_ms)

    def retire(self, now: float) -> None:
        """A newer incarnation of the source partition appeared (at the reader's clock `now`):
        what is open here is reported as "source-reset" once `wait` has passed, for the late
        records of this one to come first."""
        if self.retiring is None and not self.retired:
            self.retiring = now

    def source_ended(self, end: int) -> None:
        """The sender says its source held this incarnation's records up to `end` when it went
        away: what never arrived of them is reported as "source-reset" at retirement."""
        self.source_end = max(self.source_end, end)

    def oldest_position(self):
        """The lowest journal position of a run still waiting here (None: none waits)."""
        return min((run.origin[0] for run in self.pending.values()), default=None)

    # -- input -------------------------------------------------------------------------------

    def offer(self, run, now: float) -> Update:
        self._now = now
        frontier = self.frontier
        prev = run.prev
        if frontier is not None and not self.pending and 0 <= prev <= frontier < \
                run.offsets[0]:
            # The common case, taken first (a run a record when records are spread over many
            # partitions): the chain's next records, in order, nothing waiting.
            self.frontier = run.offsets[-1]
            if self.resumed and not run.origin[2]:
                self.resumed = False  # live records continue the chain: nothing was missed
            return Update([run], [], [])
        u = Update([], [], [])
        if run.resend:
            # An operator's resend (`diode resend`): these records were found missing. One in a
            # reported gap fills it; any other is written as well, since this state may not
            # know the gap (a restarted receiver, a gap found by `diode verify`). It never moves
            # the frontier: the chain decides that.
            u.writes.append(run)
            if self.frontier is not None and run.offsets[0] <= self.frontier:
                for offset in run.offsets:
                    if offset > self.frontier:
                        break
                    if self._fill(offset) == "gap":
                        u.filled.append(offset)
            return u
        self._offer(run, now, u)
        while self.pending_records > self.max_pending:
            self._force(u)
        if u.filled:
            self._widen(now, u.filled)
        return u

    def _offer(self, run, now: float, u: Update) -> None:
        if self.frontier is None and run.prev < 0:
            # A chain starts here: nothing is expected before it. What an earlier chain sent
            # below it and arrives late is not known written: it is written, not dropped.
            self.frontier = run.offsets[0] - 1
            self.unknown = [[0, self.frontier]] if self.frontier >= 0 else []
        frontier = self.frontier
        if frontier is not None and run.offsets[0] <= frontier:
            i = bisect.bisect_right(run.offsets, frontier)
            self._late(run, i, u)  # what is resolved already: duplicates, or fills
            if i == len(run):
                return
            run = _tail(run, i)   # the rest continues the chain from a resolved offset
        if not self.pending and frontier is not None and _key(run) <= frontier:
            u.writes.append(run)  # the common case: the chain's next records, in order
            self.frontier = run.offsets[-1]
            if self.resumed and not run.origin[2]:
                self.resumed = False  # live records continue the chain: nothing was missed
            return
        first = run.offsets[0]
        held = self.pending.get(first)
        if held is not None:  # a duplicate of a waiting run (perhaps cut differently)
            i = bisect.bisect_right(run.offsets, held.offsets[-1])
            self.duplicates += i
            if i < len(run):
                self._offer(_tail(run, i), now, u)
            else:
                self._release(u)  # (the frontier may have just been set: it may go now)
            return
        self.pending[first] = run
        self.pending_records += len(run)
        heapq.heappush(self._heap, first)
        self._arrivals.append(Arrival(now, first))
        if len(self._arrivals) > 2 * len(self.pending) + 64:
            # entries of runs written since are only dropped at the head by expire(); while
            # an old run waits there, keep the deque to about what still waits
            self._arrivals = deque(a for a in self._arrivals if a.key in self.pending)
        self._release(u)

    def heartbeat(self, chain_start: int, last_sent: int, now: float, live: bool = True,
                  sent: int | None = None, heard: int | None = None) -> None:
        """The sender's chain for this partition started at `chain_start` and has sent every
        record up to `last_sent` (`live`: not a heartbeat the journal replays; -1 and -1: no
        chain, nothing sent). `sent`: when the chain was first named, the sender time of the
        first heartbeat that carried it (an older sender's: this heartbeat's); `heard`: the
        earliest sender time of a heartbeat of the same reader this receiver has heard (both in
        ms; None: this receiver saw the chain start, see the module)."""
        if chain_start < 0:
            return
        self._heard_of(chain_start, sent, heard)
        if self.frontier is None:
            self.anchor = chain_start
        elif last_sent <= self.frontier and not (self._unaccounted(chain_start, last_sent) and
                                                 self.seen_start(chain_start)):
            return  # (nothing to report: what it claims is resolved, or a chain joined; were
            #          it found seen start later, a later claim of the chain accounts it)
        newest = self._claims[-1] if self._claims else None
        if newest is None or last_sent > newest.last or chain_start != newest.start:
            self._claims.append(Claim(now, chain_start, last_sent, live))

    def _heard_of(self, start: int, sent: int | None, heard: int | None) -> None:
        """What a heartbeat says of when the chain starting at `start` started (the module)."""
        known = self.chains.pop(start, None)
        if sent is None:
            known = known or ChainHeard(None, None)
        else:
            heard = sent if heard is None else min(heard, sent)
            known = ChainHeard(sent, heard) if known is None or known.named is None else \
                ChainHeard(min(known.named, sent), min(known.heard, heard))
        self.chains[start] = known  # (the newest last)
        while len(self.chains) > MAX_CHAINS:
            del self.chains[next(iter(self.chains))]

    def seen_start(self, start: int) -> bool:
        """Whether this receiver heard the sender's reader before the chain starting at `start`
        began, so that the chain is accounted from its first offset (the module)."""
        known = self.chains.get(start)
        return known is not None and (known.named is None or known.heard < known.named)

    def _unaccounted(self, first: int, last: int) -> bool:
        """Whether offsets of [first, last] below the frontier are in `unknown`."""
        return self.frontier is not None and first <= min(last, self.frontier) and \
            self._overlaps(self.unknown, first, min(last, self.frontier))

    def expire(self, now: float) -> Update:
        """Resolve what has waited `wait` seconds: gaps before waiting runs, claimed tails, and
        what a retirement leaves open."""
        u = Update([], [], [])
        self._now = now
        if self.retiring is not None and self.retiring < 0:
            self.retiring = now
        if self.retiring is not None and now - self.retiring >= self.wait:
            self._finish_retiring(u)
        while self.pending:
            while self._arrivals and self._arrivals[0].key not in self.pending:
                self._arrivals.popleft()
            if now - self._arrivals[0].time < self.wait:
                break
            self._force(u)
        if self.expected:
            self._expect_due(now, u)
        while self._claims and now - self._claims[0].time >= self.wait:
            _, start, last, live = self._claims.popleft()
            while self._heap and self._heap[0] <= last:
                self._force(u)
            self._anchor()
            if self._unaccounted(start, last) and self.seen_start(start):
                self._account(start, last, live, u)
            if self.frontier is not None and last > self.frontier:
                self._report(Missing(self.frontier + 1, last, self._reason(reasons.TAIL, live)), u)
                self.frontier = last
                self._release(u)
        if self.retired and not self._claims and not self.pending:
            self._source_reset(u)
        if u.filled:
            self._widen(now, u.filled)
        return u

    @property
    def busy(self) -> bool:
        """Whether expire() may have something to do."""
        return bool(self.pending or self._claims or self.expected) or \
            self.retiring is not None or (self.retired and self.source_end >= 0 and (
                self.frontier is None or self.source_end > self.frontier))

    def _finish_retiring(self, u: Update) -> None:
        """The retirement's wait is over: report what is open as "source-reset": gaps before
        waiting runs (which are written) and records expected. Tails the sender claimed are
        resolved as any claim (they may still be on their way), and what its source held
        beyond them once they are (_source_reset)."""
        self._resetting = True
        try:
            while self.pending:
                self._force(u)
            for first, last, _ in self.expected:
                u.missing.append(Missing(first, last, reasons.SOURCE_RESET))
                bisect.insort(self.gaps, [first, last])
            self.expected = []
        finally:
            self._resetting = False
        self.retiring = None
        self.retired = True

    def _source_reset(self, u: Update) -> None:
        """What the source held beyond every record resolved and claimed, when it went away
        (the sender's word): never to come."""
        if self.frontier is None:
            self._anchor()
        if self.frontier is not None and self.source_end > self.frontier:
            self._report(Missing(self.frontier + 1, self.source_end, reasons.SOURCE_RESET), u)
            self.frontier = self.source_end

    # -- internals ---------------------------------------------------------------------------

    def _pop(self):
        run = self.pending.pop(heapq.heappop(self._heap))
        self.pending_records -= len(run)
        return run

    def _release(self, u: Update) -> None:
        """Write waiting runs whose predecessor is resolved, in offset order."""
        while self._heap and self.frontier is not None:
            run = self.pending[self._heap[0]]
            if run.offsets[0] <= self.frontier:  # resolved meanwhile (a gap report ran past)
                self._pop()
                i = bisect.bisect_right(run.offsets, self.frontier)
                self._late(run, i, u)
                if i < len(run):
                    rest = _tail(run, i)
                    u.writes.append(rest)
                    self.frontier = rest.offsets[-1]
                    self.resumed = self.resumed and run.origin[2]
            elif _key(run) <= self.frontier:
                self._pop()
                u.writes.append(run)
                self.frontier = run.offsets[-1]
                self.resumed = self.resumed and run.origin[2]  # a live record: ends it
            else:
                break

    def _force(self, u: Update) -> None:
        """The lowest waiting run waited long enough: report the gap before it, write it."""
        run = self.pending[self._heap[0]]
        need = _key(run)
        if self.frontier is None:
            self._anchor()
        if self.frontier is None:
            # Joined a running chain (or its start is late): nothing is reported before it,
            # and what comes from there later is written, not taken for a duplicate.
            self.frontier = need
            self.unknown = [[0, need]] if need >= 0 else []
            if self.resumed and not run.origin[2]:
                self.down_to = need  # (its first live record: the unknown head, see _reason)
        elif need > self.frontier:
            self._report(Missing(self.frontier + 1, need,
                                 self._reason(reasons.GAP, not run.origin[2])), u)
            self.frontier = need
        self._release(u)

    def _reason(self, reason: str, live: bool, last: int | None = None) -> str:
        """What live traffic shows missing before its first record after a restart: sent while
        no receiver read (`resumed` ends when a live record is written), and so is the head of
        a chain that first record joined (up to `down_to`), should a live heartbeat account it
        only after the record was written (the heartbeat naming the chain's start came later
        than the reorder wait: a paced link, a loaded machine); what a retirement leaves open:
        "source-reset"."""
        if self._resetting:
            return reasons.SOURCE_RESET
        if live and (self.resumed or (last is not None and last <= self.down_to)):
            return reasons.RECEIVER_DOWN
        return reason

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
        """Nothing resolved yet: a chain this receiver saw start is accounted from its start."""
        if self.frontier is None and self.anchor is not None and self.seen_start(self.anchor):
            self.frontier = self.anchor - 1

    def _account(self, first: int, last: int, live: bool, u: Update) -> None:
        """A chain this receiver saw start sent every record from `first` to `last`: those
        below the frontier still in `unknown` (a lost head, then a later run written) never
        came within the wait. Reported missing, like any gap."""
        last = min(last, self.frontier)
        keep = []
        for a, b in self.unknown:
            lo, hi = max(a, first), min(b, last)
            if lo > hi:
                keep.append([a, b])
                continue
            keep += [r for r in ([a, lo - 1], [hi + 1, b]) if r[0] <= r[1]]
            self._report_below(Missing(lo, hi, self._reason(reasons.GAP, live, hi)), u)
        self.unknown = keep

    def _report_below(self, m: Missing, u: Update) -> None:
        """_report of a range below the frontier: put in its place among the reported ones."""
        u.missing.append(m)
        bisect.insort(self._reports, (m.first, m.last, self._now, self.wait))
        bisect.insort(self.gaps, [m.first, m.last])
        del self._reports[:-self.max_gaps]
        del self.gaps[:-self.max_gaps]

    def _report(self, m: Missing, u: Update) -> None:
        u.missing.append(m)
        self._reports.append((m.first, m.last, self._now, self.wait))
        if len(self._reports) > self.max_gaps:
            del self._reports[0]
        self.gaps.append([m.first, m.last])  # always above earlier gaps: the frontier only rises
        if len(self.gaps) > self.max_gaps:
            del self.gaps[0]

    def _late(self, run, n: int, u: Update) -> None:
        """The run's first n records are at or below the frontier: each fills a gap (or the
        unknown range) and is written, or is a duplicate."""
        if n == 0:
            return
        if not any(self._overlaps(ranges, run.offsets[0], run.offsets[n - 1])
                   for ranges in (self.gaps, self.unknown, self.expected)):
            self.duplicates += n  # the usual case: a copy of what was written
            return
        taken = []
        for i in range(n):
            kind = self._fill(run.offsets[i])
            if kind is None:
                self.duplicates += 1
                continue
            taken.append(i)
            if kind == "gap":
                u.filled.append(run.offsets[i])
        if taken:
            u.writes.append(run.take(taken))
            self._expect(_key(run) + 1)

    @staticmethod
    def _overlaps(ranges: list, first: int, last: int) -> bool:
        i = bisect.bisect_right(ranges, [last, float("inf")]) - 1
        return i >= 0 and ranges[i][1] >= first

    def _fill(self, offset: int) -> str | None:
        """Take `offset` out of the reported gaps ("gap") or the unknown range ("unknown");
        None if it was in neither (a duplicate)."""
        for kind, ranges in (("gap", self.gaps), ("unknown", self.unknown),
                             ("unknown", self.expected)):
            i = bisect.bisect_right(ranges, [offset, float("inf")]) - 1
            if i >= 0 and ranges[i][0] <= offset <= ranges[i][1]:
                first, last, *since = ranges[i]
                ranges[i:i + 1] = [[a, b, *since] for a, b in ((first, offset - 1),
                                                               (offset + 1, last)) if a <= b]
                return kind
        return None

    def _expect(self, floor: int) -> None:
        """A run of an earlier chain arrived in the unknown range: its chain sent every offset
        from `floor` up to where this receiver joined, so those still unknown are expected."""
        keep = []
        for first, last in self.unknown:
            if last < floor:
                keep.append([first, last])
                continue
            if first < floor:
                keep.append([first, floor - 1])
            bisect.insort(self.expected, [max(first, floor), last, self._now])
        self.unknown = keep

    def _expect_due(self, now: float, u: Update) -> None:
        """Expected offsets that have not come within the wait: reported missing, as a gap."""
        keep = []
        for first, last, since in self.expected:
            if since is None:
                since = now
            if now - since < self.wait:
                keep.append([first, last, since])
                continue
            self._report_below(Missing(first, last, reasons.GAP), u)
        self.expected = keep


class SourcePartition:
    """The states of one source partition, one per incarnation heard of: the current one, and
    up to MAX_RETIRED retired ones (oldest first) that still tell copies of their records from
    records of the current one. Pure, like PartitionState."""

    def __init__(self):
        self.current: PartitionState | None = None
        self.retired: deque = deque()

    def find(self, incarnation: bytes) -> PartitionState | None:
        if self.current is not None and self.current.incarnation == incarnation:
            return self.current
        for state in self.retired:
            if state.incarnation == incarnation:
                return state
        return None

    def adopt(self, state: PartitionState, now: float) -> PartitionState | None:
        """`state` is of an incarnation heard of for the first time: it becomes the current one
        and the current one retires (returned; None if there was none)."""
        old = self.current
        self.current = state
        if old is not None:
            old.retire(now)
            self.keep_retired(old)
        return old

    def keep_retired(self, state: PartitionState) -> None:
        """A state of an incarnation that is not (or no longer) the current one. The oldest go
        once there are more than MAX_RETIRED, never while they still have something to report."""
        self.retired.append(state)
        self.prune()

    def prune(self) -> None:
        while len(self.retired) > MAX_RETIRED and not self.retired[0].busy:
            self.retired.popleft()

    def states(self) -> list:
        """Every state, the current one first."""
        return ([self.current] if self.current is not None else []) + list(self.retired)
