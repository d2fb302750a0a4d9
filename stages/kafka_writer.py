"""kafka_writer: writes records to the destination cluster, with their provenance.

A record keeps key, value, headers and timestamp and gains sourceTopic, sourcePartition and
sourceOffset (UTF-8 strings), then receiver.written.at.header (when it was written). It goes to
prefix + source topic (or receiver.topic.rename; with sender.schemas, the registry's topic to
receiver.schemas.topic) on the same partition number when the destination topic has enough
partitions. A destination topic that does not exist is created with the source topic's partition
count (receiver.schemas.topic as a schema registry requires: 1 partition, compacted).

The runtime's loop (diode.runtime.worker.Stage.step) hands this stage the unpackers' runs and
heartbeats, a messages.Batch at a time (_batch); the stage offers them to its source partitions'
states, asks the reader to replay its journal after a restart (Stage.replays), looks at the
runs and claims waiting on the reader's clock every EXPIRE_SECONDS (a timer: _expire_waiting;
only in the partitions with something waiting, parked while none has), and hands each job to
its room (diode.writer):

- order, duplicates and gaps, per incarnation of each source partition (diode.kafka.identity):
  diode.accounting.ordering, the one place where a range is decided missing;
- diode.writer.reporter tells what it decided: missing ranges, fills, resend tickets opened and
  closed, on receiver.missing.records.topic (the reasons: diode.accounting.reasons);
- diode.writer.destination: the typed backlog, produce, acknowledgements and latency, dead letters
  and refusals, destination topics and their trouble, the events producer;
- diode.writer.recovery: the checkpoints, and what the destination holds after a restart;
- diode.writer.held: which partitions have something waiting (what the expiry timer looks at),
  and the duplicates, records waiting and open tickets over all, kept as partitions change;
- diode.writer.link_watch (writer 0): the sender's heartbeats, a silent link, a clean stop;
- diode.writer.stall: a producer that sends nothing while the destination answers (a timer);
- diode.writer.source_view: the source's lag and risk, expired ranges, digests, and (writer 0)
  the source's metadata handed to the sync (diode.kafka.metasync).

Records arrive as runs (diode.link.runs) and are decoded here, column by column; the produce call
per record is the only per-record object work.

Durability (docs/reference.md, "Restarts and outages"). Every datagram is in the reader's
journal before it comes here; each run comes with its journal position and the reader's clock
when it was read. The reorder wait runs on that clock, carried by the reader's marks: a stalled
pipeline (a restarting worker, a full queue) stops time instead of turning into false gaps. Every
receiver.checkpoint.interval.ms the writer hands everything decoded to the producer, flushes it,
and records its partitions' states and a journal position below which nothing it needs is
unwritten. A (re)started writer resumes from that, corrected by what the destination already
holds, then asks the reader to replay the journal from the checkpoints; dedup drops what was
written. Records the sender sent while no receiver was reading are reported as "receiver-down",
once: what live traffic shows missing before its first record, in a partition restored or first
seen after a restart.

When the destination cluster is down the producer keeps retrying (message.timeout.ms 0) and its
bounded queue fills: the writer stops taking input, the unpackers' queues fill, and the reader
keeps the datagrams in its journal (receiver.journal.max.bytes) until the destination is back. A
destination topic that cannot be created or written is the only one waiting: its records go to
receiver.dead.letter.topic with the error, and other topics go on. Events (missing ranges,
heartbeats, dead letters) wait in a bounded queue of their own, never in a loop.

The loop never waits on the destination (the stage contract, diode.runtime.worker): a
Preparer thread (diode.kafka.preparer) learns each destination topic's partition count, creating
the topic, and which of its partitions take records yet (a new partition's leader may not have
made its log), and reads what the destination holds for a restart, each with clients of its
own, and hands the answers back. Meanwhile the records of that topic, partition or source topic
wait in the backlog (or with the runs waiting for recovery), in their order, counted in
backlog_records: past MAX_BACKLOG_RECORDS the writer takes no more input, so waiting holds the
pipeline back and drops nothing. A checkpoint's flush, and the acknowledgement of missing ranges
before the records after them, are waited for a moment per turn (FLUSH_STEP_SECONDS) with no
input taken meanwhile; a stop waits the same way, up to its drain time, for everything to be
acknowledged (finish).
"""

import math

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from diode.runtime import transport
from diode.kafka import identity
from diode.errors import RejectedDatagram
from diode.kafka.clients import admin_config, client_settings, producer_config
from diode.kafka.metasync import MetadataSync, pins
from diode.kafka.preparer import PartitionsReady, Preparer, TopicAnswer
from diode.accounting.ordering import PartitionState, SourcePartition
from diode.link.records import partition_owner
from diode.link.runs import Run
from diode.runtime.worker import Stage as BaseStage
from diode.runtime.messages import Batch, Claim, DigestBatch, Heard, Mark, MetadataLook
from diode.writer.destination import FLUSH_STEP_SECONDS, MAX_PARTITIONS, Destination
from diode.writer.held import Held
from diode.writer.link_watch import LinkWatch
from diode.writer.recovery import Recovery
from diode.writer.reporter import Reporter
from diode.writer.source_view import SourceView
from diode.writer import stall

# The writer's producers keep the brokers they learned through an outage of the whole
# destination, reconnecting as each comes back, where librdkafka 2.16 by default starts its
# re-bootstrap sequence over and over while none answers (about 600 times in a minute's outage
# with debug=broker: every broker handle decommissioned and made again), and one such producer
# was seen never to send again, nor to answer a metadata request, after its broker was back
# (diode.writer.stall; librdkafka's own notes list re-bootstrap cases fixed in 2.16). A cluster
# whose brokers all come back at other addresses: the stall watch starts the writer afresh,
# which bootstraps again. receiver.kafka may set it otherwise.
WRITER_PRODUCER = {"metadata.recovery.strategy": "none"}
MAX_BACKLOG_RECORDS = 20000  # records decoded and waiting for the producer; past it, no input
MAX_EVENTS = 20000           # events (missing ranges, dead letters) waiting; past it, no input
INPUT_MESSAGES = 16          # unpacker messages taken per turn
EXPIRE_SECONDS = 0.02       # waiting runs and claims are looked at this often
QUEUE_FULL_WAIT_MS = 5       # the producer's queue is full: wait this long for input, not spin
MAX_READERS = 1024           # the sender's readers whose earliest heartbeat is kept (_heard)


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        r = self.r = self.t.receiver
        kafka = client_settings(self.t, "receiver")
        self.input = transport.pull(ctx.zmq, ctx.bound("in"), ctx.hwm)
        # (what an alert compares diode_ticket_oldest_age_seconds with)
        self.metrics.set("resend_horizon_seconds", r.resend_horizon_ms / 1000)
        # sender.schemas: the registry's topic, and where the low side registry reads it
        self.schemas_topic = self.t.sender.schemas_topic if self.t.sender.schemas else None
        self.source_partitions: dict = {}  # source topic -> partition count (from the sender)
        self.names: dict = {}  # source topic -> its destination topic (destination())
        # (topic, partition) -> SourcePartition: a PartitionState per incarnation heard of
        self.sources: dict = {}
        # the partitions with something waiting, and the metrics' sums (diode.writer.held)
        self.held = Held(self.sources)
        self.heard: dict = {}  # the sender's reader -> the earliest sender time (ms) heard of it
        self.writers = ctx.instances("kafka_writer")
        self.owned: dict = {}  # (topic, partition) -> whether this writer owns it (_owns)
        self.dest = Destination(r, self.metrics, self.log,
                                lambda **config: Producer(producer_config(
                                    kafka, **{**WRITER_PRODUCER, **config})),
                                self.destination, self.source_partitions, None,
                                schemas_topic=self.schemas_topic)
        self.reporter = Reporter(r, self.metrics, self.log, self.dest.emit)
        self.dest.report_refused = self.reporter.refused
        # what the destination says of its topics and holds, asked off this loop
        self.preparer = Preparer(kafka, lambda topic: pins(r.topic_configs, topic),
                                 self.dest.producer_knows).start()
        self.dest.ask_topic = self.preparer.topic
        # writer 0 applies the source's metadata to the destination (diode.kafka.metasync)
        self.sync = MetadataSync(kafka, r, self.destination).start() \
            if ctx.spec.index == 0 else None
        self.view = SourceView(r, self.metrics, self.log, sources=self.sources, owns=self._owns,
                               reporter=self.reporter, emit=self.dest.emit, sync=self.sync,
                               touched=self.held.touched, changed=self.held.take_changed)
        self.link = LinkWatch(r, self.metrics, self.log, self.dest.emit,
                              lambda: len(self.dest.event_queue), MAX_EVENTS)
        # The reader's clock and journal position, per unpacker, from its marks (messages.Mark):
        # taken once the replay this start asked for has begun there (see stages.udp_reader).
        n = ctx.instances("unpacker")
        self.marks: list = [None] * n
        self.durable = r.journal_enabled
        # A restart (of this writer, or of a receiver that checkpointed before): a partition
        # first seen now may have had records sent while no receiver read.
        self.recovery = Recovery(r, self.metrics, self.log, self.t.resolve(r.journal_dir),
                                 ctx.spec.index, self.writers, sources=self.sources,
                                 source_partitions=self.source_partitions, owns=self._owns,
                                 name_of=self.destination, state=self._state,
                                 ask_holdings=self.preparer.holdings,
                                 resuming=ctx.incarnation > 1, held=self.held)
        if self.durable:
            self.recovery.restore(self._heard)
            self.held.touched_all()  # (what a restored state waits for: looked at once)
        # A first start lost nothing (what was sent to it waited for it: the reader replays
        # the journal itself when it starts); a restart lost what its predecessor held, and
        # asks for it again, one stream per unpacker.
        self.replays(n)
        self.listen(self.input, self._batch, Batch.decode, INPUT_MESSAGES)
        # (parked while no partition has anything waiting: diode.writer.held wakes it)
        self.expiry = self.every(EXPIRE_SECONDS, self._expire_waiting)
        self.held.wake = self._wake_expiry
        # a producer that sends nothing while its destination answers (diode.writer.stall)
        self.watch = stall.ProducerWatch(self.dest, self.log, self.metrics, self.durable,
                                         lambda: AdminClient(admin_config(kafka)))
        self.every(stall.LOOK_SECONDS, self._watch_producer)

    def destination(self, topic: str) -> str:
        """A source topic's destination topic (asked for every run: kept once made)."""
        name = self.names.get(topic)
        if name is None:
            if topic == self.schemas_topic:
                name = self.r.schemas_topic  # (sender.schemas: neither prefix nor rename)
            else:
                name = self.r.topic_rename.get(topic) or self.r.topic_prefix + topic
            self.names[topic] = name
        return name

    def _owns(self, topic: str, partition: int) -> bool:
        """Whether this writer owns the source partition (asked for every run: kept, for as
        many partitions as the states are)."""
        key = (topic, partition)
        mine = self.owned.get(key)
        if mine is None:
            mine = partition_owner(topic, partition, self.writers) == self.ctx.spec.index
            if len(self.owned) < MAX_PARTITIONS:
                self.owned[key] = mine
        return mine

    # -- what the loop hands over (diode.runtime.worker.Stage.step) ----------------------------

    def before_input(self, now):
        """What comes first at every turn: the producers' callbacks, the Preparer's answers,
        the metadata handed to the sync, the queued events produced, the acknowledgements
        counted. Then no input (None) while a checkpoint's flush waits (a step of it, waited
        here) or while the destination is behind (_held_back: the backlog produced, a moment
        waited for the destination); else how long to wait for input: a moment when the
        producer's queue is full, none when the backlog can be produced now, POLL_MS while the
        turn has work of its own (_busy), else up to IDLE_WAIT_MS (_idle_wait)."""
        dest = self.dest
        dest.poll()
        if self.recovery.flushing is None and (dest.asked or dest.unready or
                                               self.recovery.asked or
                                               self.recovery.unrecovered):
            self._prepared()  # (not while a checkpoint's state waits to be saved)
        if self.sync is not None and self.sync.busy:
            self.view.hand()
        dest.produce_events()
        dest.acknowledged()
        if self.recovery.flushing is not None:
            # A checkpoint waits for the destination's acknowledgements: no input meanwhile,
            # as if the flush were one call (the state it records stays what it is).
            self.recovery.flushed(now, dest.settle)
            return None
        if self._held_back(now):
            # The destination is behind (or a checkpoint waits for the backlog to go): take no
            # input. Time stands still for the waiting runs too: it runs on the reader's marks.
            dest.produce_backlog()
            if dest.holds or dest.event_queue:
                dest.poll(0.05)  # the destination is slow or down: wait, keep order
            return None
        if dest.queue_full:
            return QUEUE_FULL_WAIT_MS
        if dest.backlog and not dest.waits():
            return 0
        return self.POLL_MS if self._busy() else self._idle_wait(now)

    def _busy(self) -> bool:
        """Whether a turn has work without input: something waits to be produced, to be
        acknowledged or to expire, or a question to the Preparer or the sync is outstanding
        (their answers come by no socket the turn waits on)."""
        dest, recovery = self.dest, self.recovery
        return bool(dest.holds or dest.event_queue or dest.events_first or len(dest.producer)
                    or (dest.events is not None and len(dest.events)) or dest.asked
                    or recovery.asked or recovery.unrecovered or self.held.busy
                    or (self.sync is not None and self.sync.busy))

    def _idle_wait(self, now: float) -> int:
        """Nothing to do but take input: wait for it up to IDLE_WAIT_MS (a signal ends the
        wait at once: diode.runtime.worker.Wakeup; the metrics' second too), and no later than
        the next checkpoint is due."""
        if not self.durable:
            return self.IDLE_WAIT_MS
        due = self.recovery.next_checkpoint - now
        return max(1, math.ceil(min(self.IDLE_WAIT_MS / 1000, due) * 1000))

    def _held_back(self, now: float) -> bool:
        """Whether no input is taken this turn: the destination is behind (the backlog or the
        events past their bounds), or a checkpoint is due and waits for the backlog to go."""
        dest = self.dest
        return dest.backlog_records >= MAX_BACKLOG_RECORDS or \
            len(dest.event_queue) >= MAX_EVENTS or (self._checkpoint_due(now) and dest.holds)

    def _checkpoint_due(self, now: float) -> bool:
        return self.durable and now >= self.recovery.next_checkpoint

    def idle(self):
        return not self.dest.holds

    def after_input(self, now):
        """The turn's fills reported, the backlog produced, and a checkpoint if one is due and
        the backlog is empty."""
        dest = self.dest
        self._report_fills()
        if dest.holds:
            dest.produce_backlog()
        if self._checkpoint_due(now) and not dest.holds:
            self._checkpoint(now)
        return True

    def _expire_waiting(self, now: float) -> None:
        """The timer (every EXPIRE_SECONDS): the waiting runs and claims looked at, at the
        reader's clock once every unpacker's marks give it. Not while no input is taken (a
        checkpoint's flush, the destination behind: time stands still) nor once finishing (a
        stop looks at them in `finish`, without a journal)."""
        clock = self._clock()
        if clock is None or self.finish_by is not None or self.recovery.flushing is not None \
                or self._held_back(now):
            return
        self._expire(clock)  # (a pass over the busy partitions)
        if not self.held.busy and self.link.last_beat is None:
            self.expiry.at(float("inf"))  # (parked until something waits: _wake_expiry)

    def _wake_expiry(self) -> None:
        """A partition has something waiting, or the sender's heartbeats came (writer 0: the
        link watch's age and silence are looked at on every pass from then on): the expiry
        timer runs at the next turn."""
        if self.expiry.due == float("inf"):
            self.expiry.at(0.0)

    def _watch_producer(self, now: float) -> None:
        """The timer (every stall.LOOK_SECONDS); not once stopping (finish says what the
        destination did not confirm)."""
        if self.finish_by is None:
            self.watch.look(now)

    def finish(self, now):
        """Stopping and nothing more is coming: write what can be written (what waits for its
        destination topic or its recovery too), wait for the destination to acknowledge it, a
        turn at a time, until `finish_by` (its drain_budget(), diode.runtime.worker), then record
        the last checkpoint; False once done. Each turn's before_input still takes the
        Preparer's answers and produces the events. Without a journal, what waits for a
        predecessor is written now and the gaps before it reported (nothing would replay it)."""
        if not self.durable:
            self._expire(float("inf"))
        dest = self.dest
        if dest.holds or dest.event_queue or self.recovery.unrecovered:
            dest.produce_backlog()
            dest.produce_events()
            if now < self.finish_by:
                dest.poll(0.05)
                return True
        left, left_events = dest.flush(FLUSH_STEP_SECONDS)
        if (left or left_events) and now < self.finish_by:
            return True
        if left or left_events or dest.holds or self.recovery.unrecovered:
            self.log.error("stopping with %d record(s) and %d event(s) not confirmed by the "
                           "destination cluster%s", left + dest.backlog_records, left_events,
                           "; the journal replays the records at the next start"
                           if self.durable else "")
        elif self.durable:
            self._checkpoint(now)  # (everything acknowledged: saved at once)
        return False

    def _batch(self, batch: Batch, frames) -> None:
        """Offer what an unpacker sent (a messages.Batch, handed over by the loop) to the
        partitions' states: a run goes Run.decode (_decode) -> _offer -> PartitionState.offer
        (order, duplicates, gaps: diode.accounting.ordering) -> the backlog (_queue) ->
        Destination.produce_backlog; a run or claim of a partition whose destination is not
        read yet waits in the recovery (Recovery.recover); a claim goes to _claim, a beat to the
        link watch (writer 0), the side messages to _heard and the source view (digests,
        metadata, the source's look); a trusted mark moves the reader's clock (_clock)."""
        recovery = self.recovery
        index = batch.unpacker
        for started in batch.notices:
            self.replay_request.noticed(started, index)
        for claim in batch.claims:
            held = (claim.topic, claim.partition, claim.incarnation)
            if held in recovery.recovered or recovery.recover(*held):
                self._claim(claim)
            else:
                recovery.unrecovered[claim.topic].append(claim)
        for frame, origin in zip(transport.split(batch.lengths, frames[1]), batch.origins):
            run = self._decode(frame)
            if run is None:
                continue
            run.origin = origin
            if (run.topic, run.partition, run.incarnation) in recovery.recovered or \
                    recovery.recover(run.topic, run.partition, run.incarnation):
                self._offer(run)
            else:  # the destination cannot be read yet: the run waits (and counts)
                recovery.unrecovered[run.topic].append(run)
                self.dest.backlog_records += len(run)
        for beat in batch.beats:
            self.link.beat(beat)
        if batch.beats:
            self._wake_expiry()
        for side in batch.sources:
            if type(side) is Heard:
                self._heard(side.reader, side.time_ms)
            elif type(side) is DigestBatch:
                self.view.digests(side.batch)
            elif type(side) is MetadataLook:
                self.view.metadata(side.meta)
            else:
                self.view.source(side.state)
        mark = batch.mark
        if mark is not None and self.replay_request.trusts(index):
            m = self.marks[index]
            self.marks[index] = mark if m is None else Mark(max(m.position, mark.position),
                                                        max(m.seen, mark.seen))

    def _offer(self, run: Run) -> None:
        source = self.sources.get((run.topic, run.partition))
        state = source.current if source is not None else None
        if state is None or state.incarnation != run.incarnation:
            state = self._state(run.topic, run.partition, run.incarnation, run.origin[1])
        wait = state.wait
        u = state.offer(run, run.origin[1])
        self.held.offered((run.topic, run.partition), state.busy)
        if u.missing or u.filled:  # (the wait only lengthens on a fill)
            self._apply(run.topic, run.partition, state, u, wait)
        else:  # the common case: runs to write, nothing to report
            self._queue(u.writes, state)

    def _claim(self, c: Claim) -> None:
        """A heartbeat's claim: the sender's chain of an incarnation of a source partition, and
        (`retired`) that the incarnation is gone, its source having held records up to `end`.
        Whether this receiver saw the chain start is told by when the chain was first named
        (`named`), against the earliest heartbeat of its reader heard (this one's own time
        counts as heard). The partition is looked at by the expiry pass (diode.writer.held) only
        if something now waits there: the claim of an idle partition, all written, costs no
        pass."""
        state = self._state(c.topic, c.partition, c.incarnation, c.seen, retired=c.retired)
        kept = state.chains.get(c.chain_start), state.source_end, state.retiring
        state.heartbeat(c.chain_start, c.last_sent, c.seen, c.live, c.named,
                        self._heard(c.reader, c.sent))
        if c.retired:
            state.source_ended(c.end)
            state.retire(c.seen)
        if state.busy:
            self.held.touched((c.topic, c.partition))
        elif (state.chains.get(c.chain_start), state.source_end, state.retiring) != kept:
            self.held.to_save((c.topic, c.partition))  # (what a restart needs of the chain)

    def _heard(self, reader: int, sent: int) -> int:
        """A heartbeat of the sender's `reader` sent at `sent` (sender time, ms) was heard: the
        earliest heard of that reader, which tells a chain this receiver saw start from one it
        joined (diode.accounting.ordering). Kept for MAX_READERS readers at most, in the
        checkpoints across restarts."""
        heard = self.heard.get(reader)
        if heard is None:
            if len(self.heard) >= MAX_READERS:
                return sent
            heard = sent
        self.heard[reader] = heard = min(heard, sent)
        return heard

    def _clock(self):
        """The reader's clock as far as every unpacker's marks have come (None: not yet)."""
        if None in self.marks:
            return None
        return min(m.seen for m in self.marks)

    def _queue(self, writes: list, state: PartitionState | None = None) -> None:
        """Runs to write, after those already waiting (a resent one cut by its tickets)."""
        for run in writes:
            if run.resend:
                for part, extra in self.reporter.cut_by_ticket(run, state):
                    self.dest.add(part, extra)
            else:
                self.dest.add(run)
                if state is not None and run.types[-1]:
                    state.last_timestamp = run.timestamps[-1]

    def _decode(self, frame) -> Run | None:
        """A run from an unpacker; one that does not decode, or belongs to another writer, is
        counted and dropped (it came from an authenticated sender, so this is a bug there)."""
        try:
            run = Run.decode(frame)
        except RejectedDatagram as exc:
            self.metrics.inc("rejects", reason=exc.reason)
            self.log.error("dropped a run that does not decode: %s", exc)
            return None
        if not self._owns(run.topic, run.partition):
            self.metrics.inc("rejects", reason="misrouted")
            self.log.error("dropped a run of %s[%d], a partition another writer owns",
                           run.topic, run.partition)
            return None
        self.source_partitions[run.topic] = run.partition_count
        return run

    def _prepared(self) -> None:
        """Take the Preparer's answers: topics to the destination, holdings to the recovery,
        which hands back what waited for them, offered here in the order it came; ask again
        for what still waits."""
        for answer in self.preparer.take():
            if isinstance(answer, TopicAnswer):
                self.dest.topic_answered(answer)
                continue
            if isinstance(answer, PartitionsReady):
                self.dest.partitions_ready(answer)
                continue
            for item in self.recovery.recovered_by(answer, self._clock()):
                if isinstance(item, Run):
                    self.dest.backlog_records -= len(item)
                    self._offer(item)
                else:
                    self._claim(item)
        self.recovery.ask_again()

    def _checkpoint(self, now: float) -> None:
        """Everything decoded is with the producer (the backlog is empty): a checkpoint."""
        self.recovery.checkpoint(now, self.marks, self.heard, self.dest.settle)

    # -- order, duplicates, gaps (diode.accounting.ordering) -----------------------------------

    def _state(self, topic: str, partition: int, incarnation: bytes, now: float | None = None,
               retired: bool = False) -> PartitionState:
        """The state of an incarnation of a source partition. One heard of for the first time
        becomes the current one, and the current one retires (diode.accounting.ordering) at the
        reader's clock `now`; one heard of only as gone (`retired`) is kept as retired."""
        source = self.sources.get((topic, partition))
        if source is None:
            source = self.sources[(topic, partition)] = SourcePartition()
        state = source.find(incarnation)
        if state is not None:
            return state
        self.held.touched((topic, partition))  # (a retirement: something waits)
        state = PartitionState(self.r.reorder_wait_ms / 1000,
                               max_wait=self.r.reorder_wait_max_ms / 1000,
                               resumed=self.recovery.resuming, incarnation=incarnation)
        if now is None:
            now = self._clock() or 0.0
        if retired:
            state.retire(now)
            source.keep_retired(state)
            return state
        old = source.adopt(state, now)
        if old is not None:
            self.metrics.inc("source_resets")
            self.log.warning("%s[%d]: records of a new incarnation of the source partition "
                             "(topic id %s, was %s): the source topic was recreated or its "
                             "cluster rebuilt. They are written from the first; what the old "
                             "one leaves open is reported as source-reset", topic, partition,
                             identity.text(incarnation), identity.text(old.incarnation))
        return state

    def _apply(self, topic: str, partition: int, state: PartitionState, u,
               wait: float | None = None) -> None:
        """An Update of a state: what it found missing reported before the records after the
        gap are written (were they written and the report lost with this process, a restart
        would take the gap for written), then its runs queued."""
        if u.missing:
            self.dest.events_first = True
        self.reporter.apply(topic, partition, state, u, wait)
        self._queue(u.writes, state)

    def _expire(self, clock: float) -> None:
        """What waits in the busy partitions (diode.writer.held) that is due at `clock`: an
        idle partition costs nothing here."""
        held = self.held
        for (t, p), source in held.due():
            for state in source.states():
                if state.busy:
                    wait = state.wait
                    self._apply(t, p, state, state.expire(clock), wait)
            if source.retired:
                source.prune()
            held.still((t, p), source)
        self._report_fills()
        self.link.check(clock, self.stopping)

    def _report_fills(self) -> None:
        for topic, partition, _ in self.reporter.fills:  # (tickets they close: counted again)
            self.held.touched((topic, partition))
        self.reporter.report_fills(self.sources)

    def sample_metrics(self):
        super().sample_metrics()
        self._export_held()
        self.metrics.set("backlog_records", self.dest.backlog_records)  # (with what recovers)
        self.view.export()

    def _export_held(self) -> None:
        """Duplicates dropped, records waiting and tickets open, over every partition, kept as
        the partitions change (diode.writer.held): once a second and at the end."""
        duplicates, pending, tickets, oldest = self.held.sums()
        self.reporter.export(tickets, oldest)
        self.metrics.set("duplicates", duplicates)
        self.metrics.set("pending_records", pending)

    def close(self):
        self._export_held()  # (the last metrics are written after close)
        self.preparer.close()
        if self.sync is not None:
            self.sync.close()
        self.dest.close()
