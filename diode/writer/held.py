"""Which of a writer's source partitions have something waiting, and what they all hold, kept as
they change: the work of a turn, and of the metrics each second, is proportional to the
partitions that changed, not to those that exist (issue 36: 10 000 partitions, most idle).

- `busy`: the source partitions one of whose states (diode.accounting.ordering) may have
  something for expire() to do (PartitionState.busy: runs waiting for their predecessor, claims
  waiting, records expected, a retirement). Every partition the writer touches (a run offered, a
  heartbeat's claim, a state made or retired, a state restored) is put in it; the expiry pass
  (`due`) walks only these and takes out those left with nothing waiting. So a partition that
  becomes busy is always in it, and an idle one costs nothing per tick.
- `changed`: the partitions touched since the metrics were last summed (`sums`): their
  duplicates, records waiting and open tickets are counted again, the others' kept; and those
  changed since the source view last asked (`take_changed`, diode.writer.source_view): their
  lag and records at risk are counted again.
- `unsaved`: the partitions touched, passed by the expiry or changed only in what a checkpoint
  keeps (`to_save`) since the last checkpoint took them (`take_unsaved`, diode.writer.recovery): only their states are compared with what the
  checkpoints hold.

This room owns the two sets and the sums; it does not own the partitions' states (the writer's
`sources`: (topic, partition) -> SourcePartition), nor what expire() decides (the writer's)."""

from typing import NamedTuple


class Tally(NamedTuple):
    """What one source partition's states hold, for the metrics."""
    duplicates: int
    pending: int
    tickets: int
    oldest: int | None  # when its oldest open ticket was opened (ms), None: no ticket open


NOTHING = Tally(0, 0, 0, None)


class Held:
    def __init__(self, sources: dict):
        self.sources = sources
        self.busy: dict = {}      # (topic, partition) -> None: an ordered set
        self.changed: set = set()
        self.summed: set = set()  # changed, summed since the source view's last take_changed
        self.unsaved: set = set()
        self.tallies: dict = {}   # (topic, partition) -> Tally, of every partition summed
        self.oldest: dict = {}    # (topic, partition) -> its oldest open ticket (ms), if any
        self.duplicates = self.pending = self.tickets = 0
        # called when `busy` gains a partition while empty: the owner's expiry timer, parked
        # while nothing waits, runs again (stages.kafka_writer)
        self.wake = None

    def touched(self, tp: tuple) -> None:
        """A source partition's states changed (or may have): looked at by the next expiry
        pass, and counted again by the next `sums`."""
        self._busy(tp)
        self.changed.add(tp)
        self.unsaved.add(tp)

    def to_save(self, tp: tuple) -> None:
        """A source partition's states changed in what a checkpoint keeps, with nothing
        waiting (a heartbeat's claim of a chain all written: when it was first named): compared
        with the checkpoints at the next one, looked at by no expiry pass."""
        self.unsaved.add(tp)

    def offered(self, tp: tuple, busy: bool) -> None:
        """A run was offered to a state of the source partition: counted again by the next
        `sums`, and looked at by the next expiry pass only if the state has something waiting
        (`busy`: PartitionState.busy after the offer). A run that came in order leaves nothing
        waiting, and a partition that was busy already is in the set: with records spread over
        1 000 partitions, the expiry looked at every partition offered a run since its last
        pass (13 % of a writer's samples at a run per record)."""
        self.changed.add(tp)
        if busy:
            self._busy(tp)

    def _busy(self, tp: tuple) -> None:
        if not self.busy and self.wake is not None:
            self.wake()
        self.busy[tp] = None

    def touched_all(self) -> None:
        """Every source partition (once, after the states were restored from checkpoints)."""
        for tp in self.sources:
            self.touched(tp)

    def due(self):
        """The busy partitions, as (tp, SourcePartition), for an expiry pass (taken apart from
        the set: the caller puts back with `still` those left busy)."""
        busy, self.busy = self.busy, {}
        for tp in busy:
            source = self.sources.get(tp)
            if source is not None:
                self.changed.add(tp)
                self.unsaved.add(tp)
                yield tp, source

    def take_changed(self) -> set:
        """The partitions changed since the last call (summed by `sums` or not yet): the
        source view's lag and records at risk (diode.writer.source_view)."""
        changed, self.summed = self.summed | self.changed, set()
        return changed

    def take_unsaved(self) -> set:
        """The partitions touched or expired since the last call (see `unsaved`)."""
        unsaved, self.unsaved = self.unsaved, set()
        return unsaved

    def still(self, tp: tuple, source) -> None:
        """After an expiry pass over `source`: kept in the set if a state has something left."""
        if any(state.busy for state in source.states()):
            self.busy[tp] = None

    def waiting(self):
        """The states of the busy partitions (every state with runs waiting is one of them)."""
        for tp in self.busy:
            source = self.sources.get(tp)
            if source is not None:
                yield from source.states()

    def sums(self) -> tuple:
        """(duplicates, records waiting, tickets open, the oldest open ticket's time in ms or
        None) over every state, counting again only the partitions changed since the last."""
        for tp in self.changed:
            source = self.sources.get(tp)
            new = tally(source.states()) if source is not None else NOTHING
            old = self.tallies.pop(tp, NOTHING)
            if new != NOTHING:
                self.tallies[tp] = new
            self.duplicates += new.duplicates - old.duplicates
            self.pending += new.pending - old.pending
            self.tickets += new.tickets - old.tickets
            if new.oldest is None:
                self.oldest.pop(tp, None)
            else:
                self.oldest[tp] = new.oldest
        self.summed |= self.changed
        self.changed.clear()
        return (self.duplicates, self.pending, self.tickets,
                min(self.oldest.values()) if self.oldest else None)


def tally(states) -> Tally:
    duplicates = pending = tickets = 0
    oldest = None
    for s in states:
        duplicates += s.duplicates
        pending += s.pending_records
        for t in s.tickets:
            tickets += 1
            oldest = t.opened if oldest is None else min(oldest, t.opened)
    return Tally(duplicates, pending, tickets, oldest)
