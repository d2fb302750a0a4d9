"""kafka_writer: writes records to the destination cluster, with their provenance.

A record keeps key, value, headers and timestamp and gains sourceTopic, sourcePartition and
sourceOffset (UTF-8 strings), then receiver.written.at.header (when it was written). It goes to
prefix + source topic (or receiver.topic.rename; with sender.schemas, the registry's topic to
receiver.schemas.topic) on the same partition number when the destination topic has enough
partitions. A destination topic that does not exist is created with the source topic's partition
count (receiver.schemas.topic as a schema registry requires: 1 partition, compacted).

The writer owns its source partitions' order, duplicates and gaps (diode.accounting.ordering),
per incarnation of each source partition (diode.kafka.identity: its topic id; records carry it in
the header sourceTopicId): records are held up to receiver.reorder.wait.ms to restore source
order, duplicates are dropped, and missing ranges (from the chain of offsets and the sender's
heartbeats) are logged, counted and written to receiver.missing.records.topic. A newer
incarnation (the source topic recreated, the source cluster rebuilt) starts afresh, and what the
older one leaves open is reported as "source-reset". Writer 0 also watches the sender's
heartbeats: a silent link is reported, unless the sender's readers said in their last
heartbeats that they stopped cleanly (wire.FLAG_STOPPING: logged once, as is the sender's return),
and each heartbeat can be recorded in receiver.heartbeat.topic.

Records arrive as runs (diode.link.runs) and are decoded here, column by column; the produce call
per record is the only per-record object work. Delivery reports come for errors only
(delivery.report.only.error): what was written is what was produced, less what librdkafka still
holds, less what failed. Events (missing ranges, heartbeats) go through a producer of their own,
so that count stays exact.

Durability (docs/reference.md, "Restarts and outages"). Every datagram is in the reader's
journal before it comes here; each run comes with its journal position and the reader's clock
when it was read. The reorder wait runs on that clock, carried by the reader's marks: a stalled
pipeline (a restarting worker, a full queue) stops time instead of turning into false gaps. Every
receiver.checkpoint.interval.ms the writer hands everything decoded to the producer, flushes it,
and records (diode.runtime.checkpoints) its partitions' states and a journal position below which
nothing it needs is unwritten. A (re)started writer resumes from that, corrected by what the
destination already holds (diode.kafka.recovery: the provenance headers of its last records, and
the missing ranges already reported), then asks the reader to replay the journal from the
checkpoints; dedup drops what was written. Records the sender sent while no receiver was reading
are reported as "receiver-down", once: what live traffic shows missing before its first record
(diode.accounting.ordering), in a partition restored or first seen after a restart.

When the destination cluster is down the producer keeps retrying (message.timeout.ms 0) and its
bounded queue fills: the writer stops taking input, the unpackers' queues fill, and the reader
keeps the datagrams in its journal (receiver.journal.max.bytes) until the destination is back. A
destination topic that cannot be created or written is the only one waiting: its records go to
receiver.dead.letter.topic with the error, and other topics go on. Events (missing ranges,
heartbeats, dead letters) wait in a bounded queue of their own, never in a loop.

The loop never waits on the destination (the stage contract, diode.runtime.worker): a
Preparer thread (diode.kafka.preparer) learns each destination topic's partition count, creating
the topic, and reads what the destination holds for a restart, each with clients of its own, and
hands the answers back. Meanwhile the records of that topic or source topic wait in the backlog
(or with the runs waiting for recovery), in their order, counted in backlog_records: past
MAX_BACKLOG_RECORDS the writer takes no more input, so waiting holds the pipeline back and drops
nothing. A checkpoint's flush, and the acknowledgement of missing ranges before the records after
them, are waited for a moment per step (FLUSH_STEP_SECONDS) with no input taken meanwhile; a stop
waits the same way, up to its drain time, for everything to be acknowledged.
"""

import json
import time
from collections import deque

from confluent_kafka import KafkaError, KafkaException, Producer

from diode.runtime import checkpoints, statedir, transport
from diode.kafka import identity
from diode.errors import RejectedDatagram
from diode.kafka.clients import client_settings, produce_run, producer_config, record_headers
from diode.kafka.metasync import MetadataSync, pins
from diode.kafka.preparer import METADATA_TIMEOUT, HoldingsAnswer, Preparer, TopicAnswer
from diode.accounting import tickets
from diode.accounting.events import DIGEST, HEARTBEAT, MISSING_RECORDS_EVENT, meaning
from diode.accounting.ordering import PartitionState, SourcePartition
from diode.accounting.ranges import merge
from diode.link.records import partition_owner
from diode.link.runs import Run
from diode.runtime.worker import Stage as BaseStage
from diode.runtime.messages import Batch, DigestBatch, Heard, Mark, MetadataLook
from diode.runtime.replays import ReplayRequest

MAX_PARTITIONS = 10000
# receiver.schemas.topic, when the writer creates it: a schema registry refuses to start on a
# topic that is not compacted (or has more than 1 partition: _ensure_topic asks for 1)
SCHEMAS_TOPIC_CONFIG = {"cleanup.policy": "compact"}
MAX_SENT_RUNS = 256          # the runs produced last, kept to name a refused record (refusals come
#                              within a round trip; each run holds its datagram in memory)
MAX_BACKLOG_RECORDS = 20000  # records decoded and waiting for the producer; past it, no input
MAX_EVENTS = 20000           # events (missing ranges, dead letters) waiting; past it, no input
INPUT_MESSAGES = 16          # unpacker messages taken per step
WRITER_LINGER_MS = 50        # librdkafka's linger.ms unless receiver.kafka sets it
EXPIRE_SECONDS = 0.02       # waiting runs and claims are looked at this often
FLUSH_SECONDS = 2.0          # a checkpoint waits this long at most for acknowledgements
FLUSH_STEP_SECONDS = 0.02    # ... and one step this long (twice at most: records, events)
QUEUE_FULL_WAIT_MS = 5       # the producer's queue is full: wait this long for input, not spin
METADATA_AGAIN_SECONDS = 1.0  # a destination topic not known yet is asked about this often
GROW_AGAIN_SECONDS = 60.0  # a destination topic with fewer partitions than its source's, same
RECOVER_AGAIN_SECONDS = 5.0  # the destination could not be read: try again after this
TOPIC_GIVE_UP_SECONDS = 60.0  # a destination topic the cluster answers for and will not
#                               create or describe this long: dead letters
MAX_JOINED_RECORDS = 4096    # consecutive runs of a partition are produced as one, up to this
MAX_LATENCY_MARKS = 4096     # runs produced and not yet acknowledged whose latency is still due
MAX_READERS = 1024           # the sender's readers whose earliest heartbeat is kept (_heard)
# Errors after which a topic or a record will never be written, whatever the wait.
REFUSED_FOR_GOOD = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.MSG_SIZE_TOO_LARGE,
                    KafkaError.TOPIC_EXCEPTION, KafkaError.POLICY_VIOLATION,
                    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
                    KafkaError.INVALID_MSG_SIZE, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                    KafkaError.INVALID_CONFIG, KafkaError.INVALID_PARTITIONS,
                    KafkaError.INVALID_REPLICATION_FACTOR}
# Errors that say the cluster (not the topic) cannot be reached now: its records wait, without
# limit, as for any outage (the journal holds what arrives meanwhile).
CLUSTER_UNAVAILABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                       KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT,
                       KafkaError.NOT_CONTROLLER, KafkaError.BROKER_NOT_AVAILABLE,
                       KafkaError.LEADER_NOT_AVAILABLE}


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        r = self.r = self.t.receiver
        kafka = client_settings(self.t, "receiver")
        self.input = transport.pull(ctx.zmq, ctx.bound("in"), ctx.hwm)
        self.kafka = kafka
        # (what an alert compares diode_ticket_oldest_age_seconds with)
        self.metrics.set("resend_horizon_seconds", r.resend_horizon_ms / 1000)
        self.producer = Producer(producer_config(kafka, **{
            # Records come in bursts of datagrams, not in a tight loop: a longer linger than
            # a relay needs fills the batches (the destination broker spent 8-11 µs per 100-byte
            # record at 5 ms, 5-7 at 50 ms, and the writer itself 5.4-7.8 against 4.4-5.9).
            "linger.ms": WRITER_LINGER_MS,
            "message.timeout.ms": 0, "delivery.report.only.error": True,
            "on_delivery": self._delivered,
            "message.max.bytes": r.max_record_bytes + 65536}))
        self.events = None  # the producer of events and dead letters, made when needed
        self.event_queue = deque()  # (topic, key, value, headers) for that producer
        self.events_first = False   # missing ranges to acknowledge before writing more
        # Runs produced since the destination last acknowledged everything (a checkpoint):
        # a delivery report carries no headers, so a refused record's source coordinates
        # are found here by its key and value.
        self.sent = deque(maxlen=MAX_SENT_RUNS)
        self.produced = 0   # records the producer accepted
        self.failed = 0     # records the destination refused
        # (records produced up to and including a run's oldest, its source timestamp in ms):
        # its end-to-end latency is observed once the destination has acknowledged as many.
        self.latency_marks: deque = deque(maxlen=MAX_LATENCY_MARKS)
        # what the destination says of its topics and holds, asked off this loop
        self.preparer = Preparer(kafka, lambda topic: pins(r.topic_configs, topic),
                                 self._producer_knows).start()
        # writer 0 applies the source's metadata to the destination (diode.kafka.metasync)
        self.sync = MetadataSync(kafka, r, self.destination).start() \
            if ctx.spec.index == 0 else None
        self.meta_times: dict = {}    # source topic or (group, topic, partition) -> the time
        #                               of the newest metadata taken for it
        self.meta_topics: dict = {}   # source topic -> its metadata, not yet applied
        self.meta_groups: dict = {}   # (group, topic, partition) -> (incarnation, offset), same
        self.asked: set = set()  # questions it has not answered yet: ("topic", destination
        #                          topic) and ("holdings", source topic), one each at most
        self.dest_partitions: dict = {}   # destination topic -> partition count
        # sender.schemas: the registry's topic, and where the low side registry reads it
        self.schemas_topic = self.t.sender.schemas_topic if self.t.sender.schemas else None
        self.source_partitions: dict = {}  # source topic -> partition count (from the sender)
        self.next_metadata: dict = {}     # topic -> when its metadata may be asked again
        self.grow_again: dict = {}        # topic -> when its count may be asked again for a
        #                                   partition it lacks
        self.topic_trouble: dict = {}     # destination topic -> (since, error, for good)
        self.backlog = deque()            # [run, next index, columns, extra headers] not yet
        #                                   all produced (the extra: a resent run's ticket)
        self.backlog_records = 0          # records in the backlog
        self.queue_full = False           # the producer's queue refused the backlog's head
        # (topic, partition) -> SourcePartition: a PartitionState per incarnation heard of
        self.sources: dict = {}
        # the source as the sender last looked at it (wire.KIND_SOURCE): (topic, partition) ->
        # (incarnation, log start, end, sender time), topic -> (retention.ms, .bytes, policy)
        self.source_state: dict = {}
        self.topic_settings: dict = {}
        self.lagging_topics: set = set()  # topics whose lag was exported (set to 0 when gone)
        self.recent_missing: deque = deque(maxlen=10_000)  # (when, records) this last hour
        self.last_beat = None             # reader's clock when the last heartbeat came (writer 0)
        self.heard: dict = {}  # the sender's reader -> the earliest sender time (ms) heard of it
        self.fills: dict = {}  # (topic, partition, incarnation) -> offsets filled late, this step
        self.beat_interval = 1.0
        self.link_silent = False
        # the sender's readers: index -> (reader's clock, stopping) of its newest heartbeat;
        # the sender stopped cleanly when every one said it stops (writer 0)
        self.readers_stopping: dict = {}
        self.sender_stopped = False
        self.next_expire = 0.0
        # The reader's clock and journal position, per unpacker, from its marks (messages.Mark):
        # taken once the replay this start asked for has begun there (see stages.udp_reader).
        n = ctx.instances("unpacker")
        self.marks: list = [None] * n
        self.writers = ctx.instances("kafka_writer")
        self.durable = r.journal_enabled
        self.dir = self.t.resolve(r.journal_dir)
        # (topic, partition, incarnation) whose destination state is known
        self.recovered: set = set()
        self.recover_at: dict = {}        # source topic -> when to try reading it again
        self.unrecovered: dict = {}       # source topic -> runs and claims waiting for that
        self.reported = None  # (topic, partition, incarnation) -> ranges reported before
        self.since_ms = None              # the oldest checkpoint's time
        # A restart (of this writer, or of a receiver that checkpointed before): a partition
        # first seen now may have had records sent while no receiver read.
        self.resuming = ctx.incarnation > 1
        self.next_checkpoint = time.monotonic() + r.checkpoint_interval_ms / 1000
        self.flushing = None   # a checkpoint waiting for the destination's acknowledgements
        self.finish_by = None  # stopping: when to give up waiting for them
        if self.durable:
            self._restore()
        # A first start lost nothing (what was sent to it waited for it: the reader replays
        # the journal itself when it starts); a restart lost what its predecessor held, and
        # asks for it again, one stream per unpacker.
        self.replay_request = ReplayRequest(ctx, n)

    def destination(self, topic: str) -> str:
        if topic == self.schemas_topic:
            return self.r.schemas_topic  # (sender.schemas: neither prefix nor rename)
        return self.r.topic_rename.get(topic) or self.r.topic_prefix + topic

    def _owns(self, topic: str, partition: int) -> bool:
        return partition_owner(topic, partition, self.writers) == self.ctx.spec.index

    # -- the loop ------------------------------------------------------------------------------

    def step(self):
        self.producer.poll(0)
        if self.events is not None:
            self.events.poll(0)
        if self.flushing is None and (self.asked or self.unrecovered):
            self._prepared()  # (not while a checkpoint's state waits to be saved)
        if self.sync is not None and self.sync.busy:
            self._sync()
        self._produce_events()
        self._acknowledged(len(self.producer))
        now = time.monotonic()
        self.replay_request.tick(now)
        if self.flushing is not None:
            # A checkpoint waits for the destination's acknowledgements: no input meanwhile,
            # as if the flush were one call (the state it records stays what it is).
            self._checkpoint_flushed(now)
            return True
        checkpoint_due = self.durable and now >= self.next_checkpoint
        if self.backlog_records >= MAX_BACKLOG_RECORDS or len(self.event_queue) >= MAX_EVENTS \
                or (checkpoint_due and self.backlog):
            # The destination is behind (or a checkpoint waits for the backlog to go): take no
            # input. Time stands still for the waiting runs too: it runs on the reader's marks.
            self._produce_backlog()
            if self.backlog or self.event_queue:
                self.producer.poll(0.05)  # the destination is slow or down: wait, keep order
            return True
        got = self.input.poll(QUEUE_FULL_WAIT_MS if self.queue_full else
                              0 if self.backlog and not self._backlog_waits() else 50)
        if self.drained(idle=not got and not self.backlog):
            return self._finish()
        if got:
            self._take_input()
        self._report_fills()
        if self.backlog:
            self._produce_backlog()
        clock = self._clock()
        if clock is not None and now >= self.next_expire:  # (a pass over every partition)
            self._expire(clock)
            self.next_expire = now + EXPIRE_SECONDS
        if checkpoint_due and not self.backlog:
            self._checkpoint(now)
        return True

    def _backlog_waits(self) -> bool:
        """Whether nothing in the backlog can be produced now: it waits for missing ranges to
        be acknowledged, or every run for its destination topic (the loop then waits for input
        rather than spin; the first run answers in the common case)."""
        return self.events_first or all(self.destination(e[0].topic) not in self.dest_partitions
                                        for e in self.backlog)

    def _finish(self) -> bool:
        """Stopping and nothing more is coming: write what can be written (what waits for its
        destination topic or its recovery too), wait for the destination to acknowledge it, a
        step at a time, up to three quarters of supervisor.drain.timeout.seconds, then record
        the last checkpoint; False once done. Without a journal, what waits for a predecessor is
        written now and the gaps before it reported (nothing would replay it)."""
        now = time.monotonic()
        if self.finish_by is None:
            self.finish_by = now + self.t.supervisor.drain_timeout_seconds * 0.75
        if not self.durable:
            self._expire(float("inf"))
        if self.backlog or self.event_queue or self.unrecovered:
            self._produce_backlog()
            self._produce_events()
            if now < self.finish_by:
                self.producer.poll(0.05)
                return True
        left = self.producer.flush(FLUSH_STEP_SECONDS)
        left_events = self._flush_events(FLUSH_STEP_SECONDS)
        if (left or left_events) and now < self.finish_by:
            return True
        self._acknowledged(left)
        if left or left_events or self.backlog or self.unrecovered:
            self.log.error("stopping with %d record(s) and %d event(s) not confirmed by the "
                           "destination cluster%s", left + self.backlog_records, left_events,
                           "; the journal replays the records at the next start"
                           if self.durable else "")
        elif self.durable:
            self._checkpoint(now)  # (everything acknowledged: saved at once)
        return False

    def _take_input(self) -> None:
        """Offer what the unpackers sent (a messages.Batch each) to the partitions' states: a
        run goes Run.decode (_decode) -> _offer -> PartitionState.offer (order, duplicates,
        gaps: diode.accounting.ordering) -> the backlog (_queue) -> _produce_backlog; a claim
        goes to _claim, a beat to _beat (writer 0), the side messages to _heard, _digests,
        _metadata and _source; a trusted mark moves the reader's clock (_clock)."""
        for frames in transport.drain(self.input, INPUT_MESSAGES):
            batch = Batch.decode(frames[0])
            index = batch.unpacker
            for started in batch.notices:
                self.replay_request.noticed(started, index)
            for claim in batch.claims:
                held = (claim.topic, claim.partition, claim.incarnation)
                if held in self.recovered or self._recover(*held):
                    self._claim(claim)
                else:
                    self.unrecovered[claim.topic].append(claim)
            for frame, origin in zip(transport.split(batch.lengths, frames[1]), batch.origins):
                run = self._decode(frame)
                if run is None:
                    continue
                run.origin = origin
                if (run.topic, run.partition, run.incarnation) in self.recovered or \
                        self._recover(run.topic, run.partition, run.incarnation):
                    self._offer(run)
                else:  # the destination cannot be read yet: the run waits (and counts)
                    self.unrecovered[run.topic].append(run)
                    self.backlog_records += len(run)
            for beat in batch.beats:
                self._beat(beat)
            for side in batch.sources:
                if type(side) is Heard:
                    self._heard(side.reader, side.time_ms)
                elif type(side) is DigestBatch:
                    self._digests(side.batch)
                elif type(side) is MetadataLook:
                    self._metadata(side.meta)
                else:
                    self._source(side.state)
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
        if u.missing or u.filled:  # (the wait only lengthens on a fill)
            self._apply(run.topic, run.partition, state, u, wait)
        else:  # the common case: runs to write, nothing to report
            self._queue(u.writes, state)

    def _claim(self, claim) -> None:
        """A heartbeat's claim: the sender's chain of an incarnation of a source partition, and
        (`retired`) that the incarnation is gone, its source having held records up to `end`."""
        topic, partition, incarnation, chain_start, last_sent, end, retired, seen, live, \
            reader, sent = claim
        state = self._state(topic, partition, incarnation, seen, retired=retired)
        state.heartbeat(chain_start, last_sent, seen, live, sent, self._heard(reader, sent))
        if retired:
            state.source_ended(end)
            state.retire(seen)

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
        """Runs to write, after those already waiting (a resent one with its tickets)."""
        for run in writes:
            if run.resend:
                self.backlog.extend(self._ticket_headers(run, state))
            else:
                self.backlog.append([run, 0, None, ()])
                if state is not None and run.types[-1]:
                    state.last_timestamp = run.timestamps[-1]
            self.backlog_records += len(run)

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

    def _report_fills(self) -> None:
        for (topic, partition, incarnation), offsets in self.fills.items():
            source = self.sources.get((topic, partition))
            state = source.find(incarnation) if source is not None else None
            for first, last in merge([(o, o) for o in offsets]):
                self._event("filled", topic, partition, first, last, "late", incarnation)
                if state is not None:
                    self._close_tickets(topic, partition, state, state.settle_tickets(first, last))
        self.fills.clear()

    # -- resend tickets (diode.accounting.tickets) ---------------------------------------------

    def _ticket(self, topic: str, partition: int, state: PartitionState, first: int,
                last: int) -> str:
        return tickets.ticket_id(identity.text(state.incarnation), topic, partition, first, last)

    def _close_tickets(self, topic: str, partition: int, state: PartitionState,
                       closed: list) -> None:
        """Tickets closed: counted, logged, and said on the missing-records topic."""
        now_ms = int(time.time() * 1000)
        for first, last, opened, how in closed:
            tid = self._ticket(topic, partition, state, first, last)
            self.metrics.inc("tickets_closed", reason=how)
            if how == "filled":
                self.metrics.inc("ticket_repair_seconds", max(0, now_ms - opened) / 1000)
            self.log.info("ticket %s (%s[%d] %d..%d) closed: %s after %.0f s", tid, topic,
                          partition, first, last, how, max(0, now_ms - opened) / 1000)
            self._publish("closed", topic, partition, first, last, how, state.incarnation,
                          ticket=tid, state=how, openedAt=opened, closedAt=now_ms)

    def _ticket_headers(self, run: Run, state: PartitionState | None) -> list:
        """A resent run as entries of the backlog, cut where the open ticket its records fill
        changes: each with the header naming that ticket (none for records of no ticket)."""
        if state is None or not state.tickets:
            return [[run, 0, None, ()]]
        parts, start, current = [], 0, None
        for i, offset in enumerate(run.offsets):
            t = state.ticket_at(offset)
            if i and t is not current:
                parts.append((start, i, current))
                start = i
            current = t
        parts.append((start, len(run), current))
        return [[run if (a, b) == (0, len(run)) else run.take(range(a, b)), 0, None,
                 ((tickets.HEADER, self._ticket(run.topic, run.partition, state, t[0],
                                                t[1]).encode()),) if t else ()]
                for a, b, t in parts]

    def _export_tickets(self) -> None:
        now_ms = int(time.time() * 1000)
        opened = [t[2] for _, s in self._all_states() for t in s.tickets]
        self.metrics.set("tickets_open", len(opened))
        self.metrics.set("ticket_oldest_age_seconds",
                         round(max(0, now_ms - min(opened)) / 1000, 3) if opened else 0)

    # -- restarts: checkpoints and what the destination holds ----------------------------------

    def _restore(self) -> None:
        """The states of this writer's partitions from every checkpoint (another writer may
        have owned some of them, with another writer count): of each partition, every
        incarnation the newest checkpoint holding it names."""
        saved = sorted(checkpoints.load_all(self.dir), key=lambda d: d["time_ms"])
        newest: dict = {}  # (topic, partition) -> its entries in the newest checkpoint
        for data in saved:
            for reader, sent in data.get("readers", {}).items():
                self._heard(int(reader), sent)
            found: dict = {}
            for topic, partition, state in data["partitions"]:
                if self._owns(topic, partition):
                    found.setdefault((topic, partition), []).append(state)
            newest.update(found)
        for (topic, partition), states in newest.items():
            for state in states:
                if state.get("destination", self.destination(topic)) != self.destination(topic):
                    self.log.warning("%s[%d] was written to %s, now to %s: starting it anew",
                                     topic, partition, state["destination"],
                                     self.destination(topic))
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

    def _recover(self, topic: str, partition: int, incarnation: bytes) -> bool:
        """Whether what the destination already holds of an incarnation of a source partition
        is known (once per start, before its first record or claim is offered), and which
        missing ranges were reported already: both from records that name the incarnation
        (sourceTopicId), never from another's. False until then: the Preparer is asked (with
        it, the same incarnation of the topic's other partitions this writer owns, and whatever
        else of the topic waits), and the caller keeps the item waiting in `unrecovered`, in
        order, counted in the backlog; `_recovered` offers it once the answer comes."""
        if (topic, partition, incarnation) in self.recovered:
            return True
        waiting = self.unrecovered.setdefault(topic, [])
        if ("holdings", topic) in self.asked or \
                time.monotonic() < self.recover_at.get(topic, 0.0):
            return False
        count = min(max(self.source_partitions.get(topic, 1), partition + 1), MAX_PARTITIONS)
        wanted = {(topic, p, incarnation) for p in range(count) if self._owns(topic, p)}
        wanted |= {waiting_for(i) for i in waiting}
        wanted.add((topic, partition, incarnation))
        wanted -= self.recovered
        missing_topic = self.r.missing_records_topic if self.reported is None else None
        since = None if self.since_ms is None else self.since_ms - 60_000
        self.preparer.holdings(topic, self.destination(topic), wanted, missing_topic or None,
                               since)
        self.asked.add(("holdings", topic))
        return False

    def _recovered(self, answer: HoldingsAnswer) -> None:
        """The Preparer's answer for a source topic: its states told what the destination holds
        and which ranges were reported, then what waited for that offered, in the order it came
        (what waits for another incarnation, asked of since, waits on)."""
        topic, wanted = answer.topic, answer.wanted
        self.asked.discard(("holdings", topic))
        if answer.error is not None:
            self.recover_at[topic] = time.monotonic() + RECOVER_AGAIN_SECONDS
            self.metrics.inc("errors", reason="recovery")
            self.log.warning("cannot read what the destination holds of %s yet (%s): its "
                             "records wait; trying again in %.0f s", self.destination(topic),
                             answer.error, RECOVER_AGAIN_SECONDS)
            return
        if self.reported is None:  # (read with the first answer; {}: no missing-records topic)
            self.reported = answer.reported or {}
        written, clock = answer.written, self._clock()
        for tp in sorted(wanted - self.recovered):
            ranges = self.reported.get(tp)
            if ranges:
                self._state(*tp, now=clock).reported(ranges)
            if tp in written:
                state = self._state(*tp, now=clock)
                before = state.frontier
                state.written_up_to(written[tp])
                if state.frontier != before:
                    self.log.info("%s[%d] (topic id %s): the destination holds records up to "
                                  "offset %d (the checkpoint said %s)", tp[0], tp[1],
                                  identity.text(tp[2]), written[tp], before)
        self.recovered |= wanted
        kept = []
        for item in self.unrecovered.pop(topic, []):  # in the order they came
            if waiting_for(item) not in self.recovered:
                kept.append(item)
            elif isinstance(item, Run):
                self.backlog_records -= len(item)
                self._offer(item)
            else:
                self._claim(item)
        if kept:
            self.unrecovered[topic] = kept

    def _prepared(self) -> None:
        """Take the Preparer's answers; ask again for what still waits (once the time to try
        again has come: with no input taken, nothing else would ask)."""
        for answer in self.preparer.take():
            if isinstance(answer, TopicAnswer):
                self._topic_answered(answer)
            else:
                self._recovered(answer)
        for topic, waiting in list(self.unrecovered.items()):
            if waiting and ("holdings", topic) not in self.asked:
                self._recover(*waiting_for(waiting[0]))

    def _low_water(self):
        """The journal position below which nothing this writer still needs lies: None until
        every unpacker's marks are trusted."""
        if None in self.marks:
            return None
        low = min(m[0] for m in self.marks)
        for _, state in self._all_states():
            if state.pending:
                low = min(low, state.oldest_position())
        for waiting in self.unrecovered.values():
            for item in waiting:
                if isinstance(item, Run):
                    low = min(low, item.origin[0])
        return low

    def _checkpoint(self, now: float) -> None:
        """Record what the destination acknowledged (see the module). Everything decoded has
        been handed to the producer (the backlog is empty): the state is taken now, and saved
        once the producers have had everything acknowledged (_checkpoint_flushed)."""
        low = self._low_water()
        if low is None:
            self.next_checkpoint = now + self.r.checkpoint_interval_ms / 1000
            return
        snapshot = [[t, p, {**state.checkpoint(), "destination": self.destination(t),
                            "incarnation": identity.text(state.incarnation),
                            "current": state is self.sources[(t, p)].current}]
                    for (t, p), state in self._all_states()]
        self.flushing = (snapshot, dict(self.heard), low, now)
        self._checkpoint_flushed(now)

    def _checkpoint_flushed(self, now: float) -> None:
        """A step of a checkpoint's flush: saved once the destination has acknowledged every
        record and event produced; given up after FLUSH_SECONDS (the destination is down or
        slow: not now; every flush sends what lingers at once, in small batches, so retrying
        soon would cost what linger.ms saves)."""
        snapshot, heard, low, started = self.flushing
        interval = self.r.checkpoint_interval_ms / 1000
        if self.producer.flush(FLUSH_STEP_SECONDS) or self._flush_events(FLUSH_STEP_SECONDS):
            # (events that wait for their topic are not in flight: no flush waits for them)
            stuck = not len(self.producer) and (self.events is None or not len(self.events))
            if stuck or now - started >= FLUSH_SECONDS:
                self.flushing = None
                self.next_checkpoint = now + interval
            return
        self.flushing = None
        self.metrics.set("checkpoint_flush_seconds", time.monotonic() - started)
        self.sent.clear()
        try:
            checkpoints.save(self.dir, self.ctx.spec.index, int(low), snapshot, self.writers,
                             int(time.time() * 1000), sync=self.r.journal_fsync == "interval",
                             readers=heard)
        except OSError as exc:
            self.metrics.inc("errors", reason="checkpoint")
            self.log.error("cannot write the checkpoint in %s: %s; a restart replays more of "
                           "the journal", self.dir, exc)
        self.metrics.inc("checkpoints")
        self.metrics.set("checkpoint_low_water", low)
        self.next_checkpoint = now + interval

    def _flush_events(self, wait: float) -> int:
        """Events still not acknowledged after `wait` (queued ones included)."""
        self._produce_events()
        left = self.events.flush(wait) if self.events is not None else 0
        self._produce_events()  # (dead letters of records refused during the flush)
        if self.event_queue and self.events is not None:
            left += self.events.flush(wait)
        return left + len(self.event_queue)

    # -- order, duplicates, gaps (diode.accounting.ordering) -----------------------------------

    def _all_states(self):
        """((topic, partition), state) of every incarnation of every source partition."""
        for tp, source in self.sources.items():
            for state in source.states():
                yield tp, state

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
        state = PartitionState(self.r.reorder_wait_ms / 1000,
                               max_wait=self.r.reorder_wait_max_ms / 1000,
                               resumed=self.resuming, incarnation=incarnation)
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
        if u.missing:
            # The report goes before the records after the gap: were they written and the
            # report lost with this process, a restart would take the gap for written.
            self.events_first = True
        now_ms = int(time.time() * 1000)
        for m in u.missing:  # (the tickets before the writes: the last record before the gap)
            self._event("missing", topic, partition, m.first, m.last, m.reason,
                        state.incarnation, ticket=self._ticket(topic, partition, state, m.first,
                                                               m.last))
            if m.reason == "source-reset":  # (its incarnation is gone: nothing can resend it)
                self._close_tickets(topic, partition, state,
                                    [[m.first, m.last, now_ms, "expired"]])
            else:
                self._close_tickets(topic, partition, state,
                                    state.open_ticket(m.first, m.last, now_ms))
        self._queue(u.writes, state)
        if u.filled:  # reported per run of offsets, once per step (_report_fills)
            self.fills.setdefault((topic, partition, state.incarnation), []).extend(u.filled)
        if wait is not None and state.wait > wait:
            self.metrics.inc("reorder_wait_widened")
            self.log.warning("%s[%d]: records arrive later than the reorder wait: now waiting "
                             "%.1f s before reporting a gap (receiver.reorder.wait.max.ms)",
                             topic, partition, state.wait)

    def _expire(self, clock: float) -> None:
        for (t, p), source in self.sources.items():
            for state in source.states():
                if state.busy:
                    wait = state.wait
                    self._apply(t, p, state, state.expire(clock), wait)
            if source.retired:
                source.prune()
        self._report_fills()
        # On the reader's clock too: a pipeline held up by the destination is not a silent link.
        if self.last_beat is not None:
            self.metrics.set("link_heartbeat_age_seconds", round(clock - self.last_beat, 3))
        if self.last_beat is not None and not self.link_silent and not self.stopping and \
                not self.sender_stopped and clock - self.last_beat > 3 * self.beat_interval:
            self.link_silent = True
            self.metrics.set("link_silent", 1)
            self.log.warning("no heartbeat from the sender for %.0f s: the link, the sender or "
                             "its source cluster is down", clock - self.last_beat)

    def sample_metrics(self):
        super().sample_metrics()
        hour_ago = time.monotonic() - 3600
        while self.recent_missing and self.recent_missing[0][0] < hour_ago:
            self.recent_missing.popleft()
        self.metrics.set("missing_ranges_last_hour", len(self.recent_missing))
        self.metrics.set("missing_records_last_hour", sum(n for _, n in self.recent_missing))
        self.metrics.set("backlog_records", self.backlog_records)  # (with what waits to recover)
        self._export_source_state()
        self._export_tickets()
        self._export_held()

    def _export_held(self) -> None:
        """Duplicates dropped and records waiting, over every partition: a pass over them all,
        so once a second (sample_metrics) and at the end, not at every expiry."""
        states = [s for _, s in self._all_states()]
        self.metrics.set("duplicates", sum(s.duplicates for s in states))
        self.metrics.set("pending_records", sum(s.pending_records for s in states))

    def _source(self, state: dict) -> None:
        """A reader's look at its source: the partitions this writer owns, newest look kept."""
        for topic, partition, incarnation, log_start, end in state["partitions"]:
            key = (topic, partition)
            known = self.source_state.get(key)
            if not self._owns(topic, partition) or (known and known[3] > state["time_ms"]):
                continue
            if known is None and len(self.source_state) >= MAX_PARTITIONS:
                continue  # (bounded, as the partitions' states are)
            self.source_state[key] = (incarnation, log_start, end, state["time_ms"])
            source = self.sources.get(key)
            held = source.find(incarnation) if source is not None else None
            for first, last in held.source_starts(log_start) if held is not None else ():
                ticket = held.ticket_at(first)
                self._expired(topic, partition, first, last, incarnation, ticket=self._ticket(
                    topic, partition, held, ticket[0], ticket[1]) if ticket else None)
                self._close_tickets(topic, partition, held, held.settle_tickets(first, last))
        for topic, retention_ms, retention_bytes, policy in state["topics"]:
            if topic in self.topic_settings or len(self.topic_settings) < MAX_PARTITIONS:
                self.topic_settings[topic] = (retention_ms, retention_bytes, policy)

    def _metadata(self, meta: dict) -> None:
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
        self._sync()

    def _newer(self, key, when: int) -> bool:
        if self.meta_times.get(key, -1) > when:
            return False
        if key not in self.meta_times and len(self.meta_times) >= MAX_PARTITIONS:
            return False  # (bounded: as many topics and group partitions as partitions)
        self.meta_times[key] = when
        return True

    def _sync(self) -> None:
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

    def _digests(self, batch: dict) -> None:
        """The sender's digests of ranges it read (diode.accounting.digests): to
        receiver.digest.topic, for diode verify. A resend's say how many records the source
        holds in each range it resent: its ticket is filled once they have all arrived."""
        if batch.get("resend"):
            for t, p, inc, first, last, count, _ in batch["partitions"]:
                source = self.sources.get((t, p))
                state = source.find(inc) if source is not None else None
                if state is not None:
                    state.source_holds(first, last, count)
                    self._close_tickets(t, p, state, state.settle_tickets(first, last))
        topic = self.r.digest_topic
        if not topic:
            return
        for t, p, inc, first, last, count, digest in batch["partitions"]:
            self.event_queue.append((topic, f"{t}-{p}".encode(), json.dumps(DIGEST.build(
                sourceTopic=t, sourcePartition=p, sourceTopicId=identity.text(inc),
                firstOffset=first, lastOffset=last, count=count, digest=digest.hex(),
                sentAt=batch["time_ms"], sourceCluster=batch["cluster"],
                resend=bool(batch.get("resend")))).encode(), None))
        self.metrics.inc("digests", len(batch["partitions"]))

    def _export_source_state(self) -> None:
        """Per source topic: the records its source holds (end - log start) and those not yet
        written here or reported missing (end - 1 - how far this writer has come: the lag),
        over the partitions this writer owns, of their current incarnations."""
        lag, held, risk = {}, {}, {}
        margin = self.r.resend_margin_records
        horizon = int(time.time() * 1000 + self.r.resend_horizon_ms)
        for (topic, partition), (inc, log_start, end, _) in self.source_state.items():
            source = self.sources.get((topic, partition))
            state = source.current if source is not None else None
            if state is not None and state.incarnation != inc:
                continue  # (a look at another incarnation than the one written)
            done = state.frontier if state is not None else log_start - 1
            done = log_start - 1 if done is None else done
            lag[topic] = lag.get(topic, 0) + max(0, end - 1 - max(done, log_start - 1))
            held[topic] = held.get(topic, 0) + max(0, end - log_start)
            retention_ms = self.topic_settings.get(topic, (-1,))[0]
            due = state.due_by(horizon, retention_ms) if state and retention_ms >= 0 else ()
            risk[topic] = risk.get(topic, 0) + (state.at_risk(margin, due) if state else 0)
        for topic in self.lagging_topics - set(lag):
            for name in ("source_lag_records", "missing_at_risk_records"):
                self.metrics.set(name, 0, topic=topic)
        for topic in lag:
            self.metrics.set("source_lag_records", lag[topic], topic=topic)
            self.metrics.set("source_held_records", held[topic], topic=topic)
            self.metrics.set("missing_at_risk_records", risk[topic], topic=topic)
        self.lagging_topics = set(lag)

    def _expired(self, topic: str, partition: int, first: int, last: int,
                 incarnation: bytes, ticket: str | None) -> None:
        """Reported missing, and now below the source's log start: never to be resent. Said
        once more, with reason expired and the ticket it is part of (counted apart: these
        records were counted missing when first reported)."""
        self.metrics.inc("missing_expired_records", last - first + 1)
        self.log.warning("missing %s[%d] offsets %d..%d expired: the source no longer holds "
                         "them, they cannot be resent", topic, partition, first, last)
        self._publish("missing", topic, partition, first, last, "expired", incarnation,
                      ticket=ticket)

    def _event(self, kind, topic, partition, first, last, reason,
               incarnation: bytes | None, **more) -> None:
        """A missing range (or a late record filling one) of an incarnation of a source
        partition: logged, counted, and written to the missing-records topic when there is
        one."""
        topic_id = identity.text(incarnation) if incarnation is not None else None
        if kind == "missing":
            self.metrics.inc("missing_ranges")
            self.metrics.inc("missing_records", last - first + 1)
            self.recent_missing.append((time.monotonic(), last - first + 1))
            self.log.warning("missing %s[%d] offsets %d..%d (%s)%s", topic, partition, first,
                             last, meaning(reason),
                             f", topic id {topic_id}" if reason == "source-reset" else "")
        else:
            self.metrics.inc("late_records", last - first + 1)
            self.log.info("late records %s[%d]@%d..%d filled a missing range", topic, partition,
                          first, last)
        self._publish(kind, topic, partition, first, last, reason, incarnation, **more)

    def _publish(self, kind, topic, partition, first, last, reason, incarnation,
                 **more) -> None:
        """An event on the missing-records topic, when there is one (`more`: its ticket and, of
        a closed one, its state and times), as diode.accounting.events defines it."""
        if self.r.missing_records_topic:
            event = MISSING_RECORDS_EVENT[kind].build(
                sourceTopic=topic, sourcePartition=partition,
                sourceTopicId=identity.text(incarnation) if incarnation is not None else None,
                firstOffset=first, lastOffset=last, reason=reason,
                detectedAt=int(time.time() * 1000), **more)
            self.event_queue.append((self.r.missing_records_topic, f"{topic}-{partition}".encode(),
                                     json.dumps(event).encode(), None))

    def _beat(self, beat: dict) -> None:
        seen = beat["seen"]  # the reader's clock when it was read
        if self.link_silent:
            self.log.info("heartbeats again after %.0f s of silence", seen - self.last_beat)
            self.link_silent = False
            self.metrics.set("link_silent", 0)
        self.last_beat = max(seen, self.last_beat or seen)
        self.beat_interval = beat["interval_ms"] / 1000
        self.metrics.inc("heartbeats")
        self._sender_stopping(beat, seen)
        if self.r.heartbeat_topic and len(self.event_queue) < MAX_EVENTS // 2:
            # (liveness, not data: dropped rather than holding input while events are behind)
            self.event_queue.append((self.r.heartbeat_topic, beat["session"].encode(), json.dumps(
                HEARTBEAT.build(
                    senderTime=beat.get("time_ms"), receivedAt=int(time.time() * 1000),
                    reader=beat.get("reader"), session=beat["session"],
                    sourceCluster=beat.get("cluster"), partitions=len(beat["partitions"]),
                    counters=beat.get("counters", {}),
                    lastSent=[{"topic": t, "partition": p, "offset": last, "chainStart": start,
                               "topicId": identity.text(inc), "sourceEnd": end,
                               "retired": retired}
                              for t, p, inc, start, last, end, retired in beat["partitions"]])
            ).encode(), None))

    def _sender_stopping(self, beat: dict, seen: float) -> None:
        """A clean stop of the sender (each of its readers' newest heartbeats marked stopping)
        is logged once, and no silent link is reported while it stays stopped; a heartbeat not
        so marked after it says the sender is back. A sender killed, or a link cut, sends no
        such heartbeat: the silence is reported."""
        reader = beat.get("reader")
        if seen >= self.readers_stopping.get(reader, (seen, False))[0]:
            self.readers_stopping[reader] = (seen, bool(beat.get("stopping")))
        stopped = all(stopping for _, stopping in self.readers_stopping.values())
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

    def _produce_events(self) -> None:
        """Hand queued events to their producer, in order, as far as it takes them now."""
        queue = self.event_queue
        if not queue:
            return
        if self.events is None:
            self.events = Producer(producer_config(self.kafka, **{
                "message.timeout.ms": 0, "on_delivery": self._event_delivered,
                "message.max.bytes": self.r.max_record_bytes + 65536}))
        while queue:
            topic, key, value, headers = queue[0]
            if topic not in self.dest_partitions and not self._ensure_topic(topic, 1):
                return  # (retried at most once a second; the log says why)
            try:
                if headers is None:
                    self.events.produce(topic, value, key)
                else:  # a dead letter (rare): its own report, which names where it came from
                    self.events.produce(topic, value, key, headers=headers, on_delivery=(
                        lambda err, msg, h=headers: self._dead_letter_delivered(err, msg, h)))
            except BufferError:
                return
            queue.popleft()
        self.metrics.set("events_waiting", len(queue))

    def _dead_letter_delivered(self, err, msg, headers):
        if err is not None:
            self._refused(headers, msg.topic(), f"{err.str()}, and then by the dead-letter "
                          f"topic")

    def _event_delivered(self, err, msg):
        if err is None:
            return
        self.metrics.inc("errors", reason="event")
        self.log.error("could not write to %s: %s", msg.topic(), err.str())

    # -- writing -------------------------------------------------------------------------------

    def _produce_backlog(self):
        """Produce waiting runs in order. A destination topic not writable yet keeps its runs
        (in their order) without holding up other topics'; one that will never be writable
        sends them to the dead-letter topic. A run's columns and header lists are built when
        its first record is offered, once: its written-at stamp is that time, as it is for the
        records waiting in the producer's queue."""
        if self.events_first:
            if self._flush_events(FLUSH_STEP_SECONDS):
                return  # (the missing-records topic is slow or down: the next step waits on)
            self.events_first = False
        stamp = self.r.written_at_header
        now_ms = int(time.time() * 1000)
        written_at = [(stamp, str(now_ms).encode())] if stamp else []
        backlog, kept, blocked = joined(self.backlog), deque(), set()
        self.queue_full = False
        while backlog:
            entry = backlog.popleft()
            run = entry[0]
            topic = self.destination(run.topic)
            if topic in blocked:
                kept.append(entry)
                continue
            if topic in self.dest_partitions and run.partition >= self.dest_partitions[topic] \
                    and self._grown(topic, run):
                del self.dest_partitions[topic]  # (asked again: raised to the source's count)
            if topic not in self.dest_partitions and \
                    not self._ensure_topic(topic, self._source_partitions(run.topic)):
                trouble = self.topic_trouble.get(topic)
                if topic_given_up(trouble, time.monotonic()):
                    self._dead_letter_run(run, entry[1], topic, trouble[1])
                    continue
                blocked.add(topic)
                kept.append(entry)
                continue
            if entry[2] is None:  # (once a run: a full queue's retry resumes where it stopped)
                own = run.header_lists()
                entry[2] = (run.key_list(), run.value_list(), own, record_headers(
                    run, own, [*written_at, *entry[3]] if entry[3] else written_at))
            partition = run.partition if run.partition < self.dest_partitions[topic] else -1
            keys, values, _, headers = entry[2]
            try:
                done = produce_run(self.producer, topic, partition, run, keys, values,
                                   headers, entry[1])
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                    raise
                # (the producer does not know a partition added just now yet: the Preparer
                # refreshes its metadata when it is asked again)
                del self.dest_partitions[topic]
                blocked.add(topic)
                kept.append(entry)
                continue
            if done > entry[1] and run.types[entry[1]]:  # one sample a run: its oldest record
                self.latency_marks.append((self.produced + 1, run.timestamps[entry[1]]))
            if entry[1] == 0 < done:  # (once a run, not at every retry; without its headers)
                self.sent.append((topic, run, entry[2][:3]))
            self.produced += done - entry[1]
            self.backlog_records -= done - entry[1]
            if done < len(run):  # the producer's queue is full: the rest waits, in order
                self.queue_full = True
                entry[1] = done
                kept.append(entry)
                kept.extend(backlog)
                backlog.clear()
        self.backlog = kept
        self.metrics.set("backlog_records", self.backlog_records)

    def _acknowledged(self, outstanding: int) -> None:
        """What the destination has acknowledged, given the records the producer still holds:
        the written count, and the end-to-end latency (source timestamp to acknowledgement) of
        each sampled run acknowledged by now. Delivery reports come for errors only, so a run
        counts as acknowledged once the records no longer held by the producer are as many as
        were produced up to its oldest: exact within a partition (librdkafka acknowledges a
        partition's records in order), approximate across partitions."""
        acknowledged = self.produced - outstanding
        self.metrics.set("records", acknowledged - self.failed)
        marks = self.latency_marks
        if not marks or marks[0][0] > acknowledged:
            return
        now_ms = time.time() * 1000
        while marks and marks[0][0] <= acknowledged:
            self.metrics.observe("end_to_end_latency_seconds",
                                 max(0.0, now_ms - marks.popleft()[1]) / 1000)

    def _dead_letter_run(self, run: Run, start: int, topic: str, error: str) -> None:
        """A run whose destination topic cannot be created: to the dead-letter topic."""
        self.backlog_records -= len(run) - start
        keys, values, own = run.key_list(), run.value_list(), run.header_lists()
        for i in range(start, len(run)):
            self._dead_letter(topic, keys[i], values[i], _headers(run, i, own), error)

    def _dead_letter(self, topic: str, key, value, headers: list, error: str) -> None:
        """A record the destination will never take: to receiver.dead.letter.topic with why,
        or reported missing ("refused") when there is none."""
        self.metrics.inc("dead_letters")
        if not self.r.dead_letter_topic:
            self._refused(headers, topic, error)
            return
        self.event_queue.append((self.r.dead_letter_topic, key, value, [
            *headers, ("diode.destination.topic", topic.encode()),
            ("diode.error", error.encode())]))

    def _refused(self, headers: list, where: str, error: str) -> None:
        """A record refused by the destination and by the dead-letter topic: reported."""
        coordinates = {k: v for k, v in headers if k.startswith("source")}
        try:
            topic = coordinates["sourceTopic"].decode()
            partition, offset = int(coordinates["sourcePartition"]), \
                int(coordinates["sourceOffset"])
        except (KeyError, ValueError):
            self.log.error("a record refused by %s carries no source coordinates: %s",
                           where, error)
            return
        self.metrics.inc("refused_records")
        self._event("missing", topic, partition, offset, offset, f"refused: {error}",
                    identity.parse(coordinates.get("sourceTopicId", b"")),
                    ticket=None)  # (a refused record is no ticket)

    def _delivered(self, err, msg):
        """Called for records the destination refused (delivery.report.only.error): with
        message.timeout.ms 0, only for good."""
        self.failed += 1
        self.metrics.inc("errors", reason="produce")
        headers = self._headers_of(msg)
        where = {k: v.decode() for k, v in headers if k.startswith("source")}
        self.log.error("a record (%s) was not written to %s[%s]: %s; sending it to the "
                       "dead-letter topic", ", ".join(f"{k} {v}" for k, v in where.items()) or
                       "source unknown", msg.topic(), msg.partition(), err.str())
        self._dead_letter(msg.topic(), msg.key(), msg.value(), headers, err.str())

    def _headers_of(self, msg) -> list:
        """A refused record's headers, provenance included: delivery reports carry none, so
        the record is looked up among the runs produced since the last acknowledgement."""
        key, value = msg.key(), msg.value()
        for topic, run, (keys, values, own) in reversed(self.sent):
            if topic != msg.topic():
                continue
            for i, (k, v) in enumerate(zip(keys, values)):
                if v == value and k == key:
                    return _headers(run, i, own)
        return list(msg.headers() or [])

    def _source_partitions(self, source_topic: str) -> int:
        """The partition count the sender gave for a source topic (a new destination's)."""
        return max(1, min(int(self.source_partitions.get(source_topic, 1)), MAX_PARTITIONS))

    def _producer_knows(self, topic: str) -> None:
        """From the Preparer's thread: the producer's metadata of `topic` refreshed (it holds
        a count for minutes, and refuses records of partitions added since)."""
        self.producer.list_topics(topic=topic, timeout=METADATA_TIMEOUT)

    def _grown(self, topic: str, run: Run) -> bool:
        """Whether a destination topic's count should be asked again: a run of a partition it
        lacks, whose source topic has more partitions than it (the source's count was raised;
        the Preparer raises the destination's). At most once per GROW_AGAIN_SECONDS: a
        destination that cannot raise it gets the partition's records spread by key."""
        now = time.monotonic()
        if run.partition_count <= self.dest_partitions[topic] or \
                now < self.grow_again.get(topic, 0.0):
            return False
        self.grow_again[topic] = now + GROW_AGAIN_SECONDS
        return True

    def _ensure_topic(self, topic: str, partitions: int) -> bool:
        """Whether a destination topic's partition count is known. False until then: the
        Preparer is asked (at most once per METADATA_AGAIN_SECONDS per topic) to learn it,
        creating the topic with `partitions` if it does not exist; `_topic_answered` keeps
        the trouble in topic_trouble."""
        if topic in self.dest_partitions:
            return True
        now = time.monotonic()
        if ("topic", topic) in self.asked or now < self.next_metadata.get(topic, 0.0):
            return False
        if self.schemas_topic and topic == self.r.schemas_topic:
            # as a registry requires of its topic, whatever the source's (a registry refuses
            # more than one partition, and a topic not compacted)
            self.preparer.topic(topic, 1, SCHEMAS_TOPIC_CONFIG)
        else:
            self.preparer.topic(topic, partitions)
        self.asked.add(("topic", topic))
        return False

    def _topic_answered(self, answer: TopicAnswer) -> None:
        topic = answer.topic
        self.asked.discard(("topic", topic))
        now = time.monotonic()
        self.next_metadata[topic] = now + METADATA_AGAIN_SECONDS
        if answer.created:
            self.log.info("created destination topic %s with %d partition(s)", topic,
                          answer.partitions)
        if answer.partitions:
            if self.schemas_topic and topic == self.r.schemas_topic and answer.partitions > 1:
                self.log.error("receiver.schemas.topic %s has %d partitions: a schema registry "
                               "refuses to read it (it must have 1); its records are written "
                               "to partition 0", topic, answer.partitions)
            self.dest_partitions[topic] = answer.partitions
            self.topic_trouble.pop(topic, None)
            return
        error = answer.error
        for_good = error.code() in REFUSED_FOR_GOOD  # (for the warning)
        if topic not in self.topic_trouble:
            self.log.warning("cannot read or create destination topic %s: %s; %s", topic,
                             error.str(), "its records go to the dead-letter topic"
                             if for_good else "retrying, other topics go on")
        self.topic_trouble[topic] = topic_trouble(self.topic_trouble.get(topic), now, error)
        self.metrics.inc("errors", reason="metadata")

    def close(self):
        self._export_held()  # (the last metrics are written after close)
        self.preparer.close()
        if self.sync is not None:
            self.sync.close()
        self.producer.flush(1)
        if self.events is not None:
            self.events.flush(1)


def topic_trouble(before, now: float, error) -> tuple:
    """A destination topic's trouble after `error`, given the trouble before (None): (since,
    error text, for good). A topic is given up (dead letters) once it was refused for good, or
    TOPIC_GIVE_UP_SECONDS after `since`; an unreachable cluster says nothing of the topic, so
    the clock starts again from each such error: an outage is waited out, however long."""
    code = error.code()
    if before is not None and code not in CLUSTER_UNAVAILABLE and code not in REFUSED_FOR_GOOD:
        return before
    return (now, error.str(), code in REFUSED_FOR_GOOD)


def waiting_for(item) -> tuple:
    """(source topic, partition, incarnation) of a run or a heartbeat's claim waiting for what
    the destination holds of it (the writer's `unrecovered`)."""
    return (item.topic, item.partition, item.incarnation) if isinstance(item, Run) else item[:3]


def topic_given_up(trouble, now: float) -> bool:
    """Whether a destination topic with `trouble` (topic_trouble's, or None) is given up at
    `now`: its records go to the dead-letter topic."""
    return trouble is not None and (trouble[2] or now - trouble[0] >= TOPIC_GIVE_UP_SECONDS)


def _headers(run: Run, i: int, own) -> list:
    """Record i's headers as written: its own, then the provenance (the dead-letter paths; the
    hot path builds the same in diode.kafka.clients.produce_run)."""
    return [*(own[i] if own is not None else ()), ("sourceTopic", run.topic.encode()),
            ("sourcePartition", b"%d" % run.partition), ("sourceOffset", b"%d" % run.offsets[i]),
            ("sourceTopicId", identity.text(run.incarnation).encode())]


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


def joined(backlog: deque) -> deque:
    """The backlog with each partition's consecutive runs that wait whole (none of their records
    produced yet) joined into one (Run.join), up to MAX_JOINED_RECORDS: the cost per run
    (columns, the produce loop's setup, a sent entry, a latency mark) once per join. Each
    source partition's runs stay in their order; the order across partitions is not kept
    (it is not a promise: a destination partition takes one source partition's records)."""
    if len(backlog) < 2:
        return backlog
    out, chains = [], {}  # chains: (topic, partition, incarnation) -> the runs being joined
    for entry in backlog:
        run = entry[0]
        key = (run.topic, run.partition, run.incarnation)
        chain = chains.get(key)
        if entry[1] or entry[2] is not None or run.resend:
            chains.pop(key, None)  # (what follows it must not join what came before it)
            out.append(entry)
        elif chain is not None and chain[-1].last == run.prev and \
                (chain[-1].headers is None) == (run.headers is None) and \
                chain.records + len(run) <= MAX_JOINED_RECORDS:
            chain.append(run)
            chain.records += len(run)
        else:
            chains[key] = chain = _Chain([run])
            chain.records = len(run)
            out.append(chain)
    return deque(([Run.join(x) if len(x) > 1 else x[0], 0, None, ()]
                  if isinstance(x, _Chain) else x) for x in out)


class _Chain(list):
    __slots__ = ("records",)
