"""Restarts: the writer's checkpoints, and what the destination already holds.

Every receiver.checkpoint.interval.ms the writer hands everything decoded to the producer,
flushes it, and records (diode.runtime.checkpoints) its partitions' states and a journal
position below which nothing it needs is unwritten (checkpoint, then flushed step by step):
nothing when none of it changed since the last one, and between two whole checkpoints only the
partitions changed since the whole one (its changes file), so that 10 000 idle partitions are not
serialized and synced every 5 s. A (re)started writer restores its partitions' states from the
checkpoints (restore), corrected by what the destination holds (recover: the Preparer reads the
provenance headers of the last records and the missing ranges already reported,
diode.kafka.recovery), before the first run or claim of each incarnation of a source partition
is offered; until then these wait here, in `unrecovered`, in their order. The source topics met
in a turn are asked of in one question (ask_again), which the Preparer reads together.

This room owns the checkpoints' schedule and flush, the incarnations recovered, what waits for
recovery and the ranges reported before. It does not own the partitions' states (it gets the
writer's `sources` and a `state(topic, partition, incarnation, now=...)` to make one), the
producer (it gets a `settle(wait)` that says whether everything was acknowledged), nor the
journal's replay (stages.kafka_writer asks for it).
"""

import time
import uuid

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.kafka import identity
from diode.link.runs import Run
from diode.runtime import checkpoints, statedir
from diode.writer.destination import FLUSH_STEP_SECONDS, MAX_PARTITIONS

FLUSH_SECONDS = 2.0          # a checkpoint waits this long at most for acknowledgements (and
#                              FLUSH_STEP_SECONDS a step)
RECOVER_AGAIN_SECONDS = 5.0  # the destination could not be read: try again after this
RECOVER_SOON_SECONDS = 0.5   # ... a topic whose partitions' leaders are still being made (a
#                              topic just created, by this writer or the metadata sync): sooner
SETTLING = ("not leader", "leader not available")  # (what the broker says of such a partition)
WHOLE_FRACTION = 4           # a whole checkpoint once the changes would hold a quarter of the
WHOLE_AT_LEAST = 64          # partitions (of this many at least)
WHOLE_LOOK_SECONDS = 300.0   # every state compared with its checkpoint this often, not only
#                              those the writer touched since the last (diode.writer.held)


class Recovery:
    def __init__(self, settings, metrics, log, journal_dir, index: int, writers: int, *,
                 sources: dict, source_partitions: dict, owns, name_of, state,
                 ask_holdings=None, resuming: bool = False, held=None):
        """`settings`: the receiver's; `journal_dir`: where the checkpoints are; `index`,
        `writers`: this writer's and their count; `sources`: (topic, partition) ->
        SourcePartition, the writer's; `source_partitions`: source topic -> partition count;
        `owns(topic, partition)`; `name_of(source topic)`: its destination topic;
        `state(topic, partition, incarnation, now=None)`: the writer's state of it, made if
        new; `ask_holdings(...)`: the Preparer's `holdings`; `resuming`: a restart; `held`:
        the writer's diode.writer.held.Held (None: every state is looked at)."""
        self.r, self.metrics, self.log, self.dir = settings, metrics, log, journal_dir
        self.index, self.writers = index, writers
        self.sources, self.source_partitions = sources, source_partitions
        self.owns, self.name_of, self.state = owns, name_of, state
        self.ask_holdings = ask_holdings
        self.held = held
        # (topic, partition, incarnation) whose destination state is known
        self.recovered: set = set()
        self.asked: set = set()           # source topics asked of, not yet answered
        self.to_ask: dict = {}            # source topic -> what to ask of it at ask_again
        self.recover_at: dict = {}        # source topic -> when to try reading it again
        self.settling: set = set()        # source topics whose destination is not ready yet
        self.unrecovered: dict = {}       # source topic -> runs and claims waiting for that
        self.reported = None  # (topic, partition, incarnation) -> ranges reported before
        self.since_ms = None              # the oldest checkpoint's time
        # A restart (of this writer, or of a receiver that checkpointed before): a partition
        # first seen now may have had records sent while no receiver read.
        self.resuming = resuming
        self.next_checkpoint = time.monotonic() + settings.checkpoint_interval_ms / 1000
        self.flushing = None   # a checkpoint waiting for the destination's acknowledgements
        # What the last checkpoint written says: (topic, partition) -> its entries, the low
        # water, the readers heard; the whole checkpoint's id (None: none written by this
        # start) and the partitions changed since it (in its changes file)
        self.saved: dict = {}
        self.saved_low = self.saved_heard = None
        self.whole_id = None
        self.unsaved: set = set()
        # the partitions whose states may have changed since the last checkpoint written
        # (diode.writer.held: touched or expired), and when every state is looked at again
        self.candidates: set = set()
        self.look_all_at = 0.0

    def restore(self, heard) -> None:
        """The states of this writer's partitions from every checkpoint (another writer may
        have owned some of them, with another writer count): of each partition, every
        incarnation the newest checkpoint holding it names. `heard(reader, sent)`: the sender's
        readers heard of, as the checkpoints kept them."""
        saved = sorted(checkpoints.load_all(self.dir), key=lambda d: d["time_ms"])
        newest: dict = {}  # (topic, partition) -> its entries in the newest checkpoint
        for data in saved:
            for reader, sent in data.get("readers", {}).items():
                heard(int(reader), sent)
            found: dict = {}
            for topic, partition, state in data["partitions"]:
                if self.owns(topic, partition):
                    found.setdefault((topic, partition), []).append(state)
            newest.update(found)
        for (topic, partition), states in newest.items():
            for state in states:
                if state.get("destination", self.name_of(topic)) != self.name_of(topic):
                    self.log.warning("%s[%d] was written to %s, now to %s: starting it anew",
                                     topic, partition, state["destination"],
                                     self.name_of(topic))
                    continue
                incarnation = identity.parse(str(state.get("incarnation", "")))
                if incarnation is None:
                    self.log.warning("%s[%d]: a checkpoint's state names no incarnation: not "
                                     "used", topic, partition)
                    continue
                restored = PartitionState.restore(
                    state, self.r.reorder_wait_ms / 1000, self.r.reorder_wait_max_ms / 1000,
                    incarnation=incarnation)
                source = self.sources.setdefault((topic, partition), SourcePartition())
                if state.get("current") and source.current is None:
                    source.current = restored
                else:
                    source.keep_retired(restored)
        if saved:
            self.resuming = True
            self.since_ms = saved[0]["time_ms"]
            self.log.info("resuming %d partition(s) from the checkpoints in %s: %s",
                          len(self.sources), self.dir, held_state(self.sources) or "none")
        for topic, _ in self.sources:
            self.source_partitions.setdefault(topic, 1)

    # -- what the destination holds ----------------------------------------------------------

    def recover(self, topic: str, partition: int, incarnation: bytes) -> bool:
        """Whether what the destination already holds of an incarnation of a source partition
        is known (once per start, before its first record or claim is offered), and which
        missing ranges were reported already: both from records that name the incarnation
        (sourceTopicId), never from another's. False until then: the topic is to be asked of
        (with it, the same incarnation of the topic's other partitions this writer owns, and
        whatever else of the topic waits) at the next `ask_again`, with every other topic met
        meanwhile, in one question; the caller keeps the item waiting in `unrecovered`, in
        order, counted in the backlog; `recovered_by` hands it back once the answer comes."""
        if (topic, partition, incarnation) in self.recovered:
            return True
        self.unrecovered.setdefault(topic, [])
        if topic not in self.asked and time.monotonic() >= self.recover_at.get(topic, 0.0):
            self.to_ask.setdefault(topic, set()).add((topic, partition, incarnation))
        return False

    def ask_again(self) -> None:
        """Ask, in one question, of every topic met since the last call and of what still
        waits once the time to try again has come (with no input taken, nothing else would
        ask)."""
        now = time.monotonic()
        for topic, waiting in self.unrecovered.items():
            if waiting and topic not in self.asked and now >= self.recover_at.get(topic, 0.0):
                self.to_ask.setdefault(topic, set()).add(waiting_for(waiting[0]))
        if not self.to_ask:
            return
        asked = {}
        for topic, first in self.to_ask.items():
            incarnations = {inc for _, _, inc in first}
            count = min(max([self.source_partitions.get(topic, 1)] +
                            [p + 1 for _, p, _ in first]), MAX_PARTITIONS)
            wanted = {(topic, p, inc) for p in range(count) if self.owns(topic, p)
                      for inc in incarnations}
            wanted |= first | {waiting_for(i) for i in self.unrecovered.get(topic, ())}
            asked[topic] = (self.name_of(topic), wanted - self.recovered)
        self.to_ask = {}
        missing_topic = self.r.missing_records_topic if self.reported is None else None
        since = None if self.since_ms is None else self.since_ms - 60_000
        self.ask_holdings(asked, missing_topic or None, since)
        self.asked |= set(asked)

    def recovered_by(self, answer, clock) -> list:
        """The Preparer's answer for a source topic: its states told what the destination holds
        and which ranges were reported (at the reader's `clock`); returns what waited for that,
        in the order it came, to be offered (what waits for another incarnation, asked of
        since, waits on)."""
        topic, wanted = answer.topic, answer.wanted
        self.asked.discard(topic)
        if answer.error is not None:
            if any(words in answer.error.lower() for words in SETTLING):
                # (a topic just created: its leaders come within seconds; no error, and said
                # once a topic, not at every try)
                self.recover_at[topic] = time.monotonic() + RECOVER_SOON_SECONDS
                if topic not in self.settling:
                    self.settling.add(topic)
                    self.log.info("%s is not ready to be read yet (%s): its records wait; "
                                  "trying again every %.1f s", self.name_of(topic),
                                  answer.error, RECOVER_SOON_SECONDS)
                return []
            self.recover_at[topic] = time.monotonic() + RECOVER_AGAIN_SECONDS
            self.metrics.inc("errors", reason="recovery")
            self.log.warning("cannot read what the destination holds of %s yet (%s): its "
                             "records wait; trying again in %.0f s", self.name_of(topic),
                             answer.error, RECOVER_AGAIN_SECONDS)
            return []
        self.settling.discard(topic)
        if self.reported is None:  # (read with the first answer; {}: no missing-records topic)
            self.reported = answer.reported or {}
        written = answer.written
        for tp in sorted(wanted - self.recovered):
            ranges = self.reported.get(tp)
            if (ranges or tp in written) and self.held is not None:
                self.held.touched(tp[:2])  # (its state changes: checkpointed again)
            if ranges:
                self.state(*tp, now=clock).reported(ranges)
            if tp in written:
                state = self.state(*tp, now=clock)
                before = state.frontier
                state.written_up_to(written[tp])
                if state.frontier != before:
                    self.log.info("%s[%d] (topic id %s): the destination holds records up to "
                                  "offset %d (the checkpoint said %s)", tp[0], tp[1],
                                  identity.text(tp[2]), written[tp], before)
        self.recovered |= wanted
        kept, ready = [], []
        for item in self.unrecovered.pop(topic, []):  # in the order they came
            (ready if waiting_for(item) in self.recovered else kept).append(item)
        if kept:
            self.unrecovered[topic] = kept
        return ready

    # -- checkpoints -------------------------------------------------------------------------

    def low_water(self, marks: list):
        """The journal position below which nothing this writer still needs lies, given the
        unpackers' marks (messages.Mark): None until every one is trusted."""
        if None in marks:
            return None
        low = min(m.position for m in marks)
        # (a state with runs waiting is busy: only the busy partitions need a look)
        states = self.held.waiting() if self.held is not None else \
            (state for source in self.sources.values() for state in source.states())
        for state in states:
            if state.pending:
                low = min(low, state.oldest_position())
        for waiting in self.unrecovered.values():
            for item in waiting:
                if isinstance(item, Run):
                    low = min(low, item.origin[0])
        return low

    def checkpoint(self, now: float, marks: list, heard: dict, settle) -> None:
        """Record what the destination acknowledged (see the module). Everything decoded has
        been handed to the producer (the backlog is empty): the state is taken now, and saved
        once the producers have had everything acknowledged (`flushed`, with `settle`).

        Nothing is written (nor flushed) when neither a partition's state, nor the low water,
        nor the readers heard changed since the last checkpoint this writer wrote: the file
        already says all of it (only its time would be newer, and a restart reads the reported
        ranges from that time less a minute: from an older one, it reads more of them, never
        fewer). The first checkpoint of a start is always written (whole), so the files of the
        writers now running are newer than any file that another writer count left.

        Only the states of the partitions the writer touched or expired since the last one
        (diode.writer.held `unsaved`) are taken and compared with what the checkpoints hold,
        and every state once every WHOLE_LOOK_SECONDS: at 10 000 idle partitions a checkpoint
        costs what changed, not 150 ms every interval."""
        low = self.low_water(marks)
        if low is None:
            self.next_checkpoint = now + self.r.checkpoint_interval_ms / 1000
            return
        if self.held is not None:
            self.candidates |= self.held.take_unsaved()
        every = self.whole_id is None or self.held is None or now >= self.look_all_at
        if every:  # (the first of a start, and every WHOLE_LOOK_SECONDS: every state looked at)
            self.candidates = set(self.sources) | set(self.saved)
        changed = {}
        for tp in self.candidates:
            source = self.sources.get(tp)
            entries = [] if source is None else [
                [tp[0], tp[1], {**state.checkpoint(), "destination": self.name_of(tp[0]),
                                "incarnation": identity.text(state.incarnation),
                                "current": state is source.current}]
                for state in source.states()]
            if entries != self.saved.get(tp, []):
                changed[tp] = entries
        if every:
            self.look_all_at = now + WHOLE_LOOK_SECONDS
        if self.whole_id is not None and not changed and low == self.saved_low and \
                heard == self.saved_heard:
            self.candidates = set()
            self.next_checkpoint = now + self.r.checkpoint_interval_ms / 1000
            return
        self.flushing = (changed, dict(heard), low, now)
        self.flushed(now, settle)

    def flushed(self, now: float, settle) -> None:
        """A step of a checkpoint's flush: saved once `settle(wait)` says the destination has
        acknowledged every record and event produced; given up after FLUSH_SECONDS (the
        destination is down or slow: not now; every flush sends what lingers at once, in small
        batches, so retrying soon would cost what linger.ms saves)."""
        changed, heard, low, started = self.flushing
        interval = self.r.checkpoint_interval_ms / 1000
        left = settle(FLUSH_STEP_SECONDS)
        if left is not None:
            if left == "stuck" or now - started >= FLUSH_SECONDS:
                self.flushing = None
                self.next_checkpoint = now + interval
            return
        self.flushing = None
        self.metrics.set("checkpoint_flush_seconds", time.monotonic() - started)
        try:
            self._save(changed, heard, int(low))
        except OSError as exc:
            self.metrics.inc("errors", reason="checkpoint")
            self.log.error("cannot write the checkpoint in %s: %s; a restart replays more of "
                           "the journal", self.dir, exc)
        self.metrics.inc("checkpoints")
        self.metrics.set("checkpoint_low_water", low)
        self.next_checkpoint = now + interval

    def _save(self, changed: dict, heard: dict, low: int) -> None:
        """The states changed since the last whole checkpoint, over it (its changes file), or
        a whole one: the first of a start, and once the changes would hold a quarter of the
        partitions (diode.runtime.checkpoints)."""
        now_ms = int(time.time() * 1000)
        sync = self.r.journal_fsync == "interval"
        saved = {**self.saved, **changed}
        for tp, entries in changed.items():
            if not entries:
                del saved[tp]
        unsaved = self.unsaved | set(changed)
        if self.whole_id is None or len(unsaved) * WHOLE_FRACTION > max(len(saved),
                                                                        WHOLE_AT_LEAST):
            whole_id = uuid.uuid4().hex
            checkpoints.save(self.dir, self.index, low,
                             [e for entries in saved.values() for e in entries],
                             self.writers, now_ms, sync=sync, readers=heard, whole_id=whole_id)
            self.whole_id, unsaved = whole_id, set()
        else:
            checkpoints.save_changes(
                self.dir, self.index, self.whole_id, low,
                [e for tp in sorted(unsaved) for e in saved.get(tp, ())],
                [tp for tp in sorted(unsaved) if tp not in saved], now_ms, sync=sync,
                readers=heard)
        self.unsaved, self.candidates = unsaved, set()
        self.saved, self.saved_low, self.saved_heard = saved, low, heard


def waiting_for(item) -> tuple:
    """(source topic, partition, incarnation) of a run or a heartbeat's claim waiting for what
    the destination holds of it (Recovery.unrecovered)."""
    return (item.topic, item.partition, item.incarnation) if isinstance(item, Run) else item[:3]


def held_state(sources: dict, most: int = 10) -> str:
    """The incarnations a writer holds state for, per source partition (the first `most`), in
    a line, as diode check and status show them from the checkpoints."""
    held = sorted(sources.items())
    lines = statedir.held_lines([
        {"topic": t, "partition": p, "incarnations": [
            {"topic_id": identity.text(s.incarnation), "frontier": s.frontier,
             "current": s is source.current} for s in source.states()]}
        for (t, p), source in held[:most]])
    return "; ".join(lines) + (f"; and {len(held) - most} more" if len(held) > most else "")
