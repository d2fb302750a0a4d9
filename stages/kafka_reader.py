"""kafka_reader: reads the source topics with manual assignment and commits what was sent.

Each reader owns a fixed share of the source partitions (diode.kafka.clients.replicated) and
looks for new topics and partitions every refresh.topics.interval.seconds, from a thread
(diode.kafka.refresh): a slow source cluster never holds up the loop or its heartbeats. What one
consume call returns goes to a packer as one message: a run per partition (diode.link.runs,
encoded here once, as it will cross the link) as ZeroMQ frames after a small header: the
runtime's loop (diode.runtime.worker.Stage.step) polls the consumer through Stage.poll_input and
hands what it returned to Stage.take_input -> Stage._send_records -> the packer's outbox;
udp_senders (and packers, for dead-lettered records) acknowledge them back, and the longest
fully acknowledged prefix of each partition is committed to the source cluster's consumer group
(diode.kafka.offsets.SentTracker).

If acknowledgements stop coming (a packer or the udp_sender died: SIGUSR1 from the supervisor,
or inflight.timeout.seconds passed), the reader rewinds to its committed positions and reads
again: at least once.

Every run names the incarnation of its source partition (diode.kafka.identity: the topic id,
which the watcher checks every identity.check.interval.ms), and so do the commits (their
metadata). A topic whose id changes was deleted and recreated, or its cluster rebuilt: the
reader stops reading the old incarnation, tells the receiver in its heartbeats for a day where
the old one's chains stood and where its source ended (a retired claim, so the receiver reports
what never crossed as "source-reset"), and reads the new one from its first record. A partition
whose position the source no longer holds (retention deleted records before they were read, or
the log was truncated) is looked at the same way, then read from its start in a new chain.

A heartbeat claims every partition of the current chains, or with sender.heartbeat.claims.max
those whose claim changed and a bounded slice of the rest, in turn (diode.kafka.claims); what
a restart needs to know is recorded at a heartbeat when it changed, and after a look of the
watcher that changed it, by a thread of its own from a picture the loop takes
(diode.kafka.lineage.Keeper).

Over thousands of partitions its work per turn follows what changed, not what it reads: the
source's state goes across whole every SOURCE_WHOLE_LOOKS looks and otherwise only what
changed; a commit asks the consumer's position (past transaction markers) of a bounded number
of partitions whose end lies past what was sent, those whose sent position moved first, the
others in turn; the ends its own fetches saw are taken of the partitions read since the last
time, for 20 ms at most a look (the rest at the next); reader 0's metadata is compared with what was sent once per look. Partitions the source does not answer for yet wait, and are told,
while the others are read (diode.kafka.refresh).

`diode resend` runs stages.kafka_resender in this stage's place: this reader, reading a
manifest's ranges outside any chain, committing nothing, and finishing when they are sent.
"""

import os
import re
import time
from collections import deque
from itertools import groupby, islice
from operator import itemgetter

from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException,
                             Message, TopicPartition)

from diode.accounting.digests import Digester, message_hashes
from diode.link import runs
from diode.runtime import transport
from diode.runtime.messages import Acks, DigestBatch, Heartbeat, MetadataLook, Runs, SourceLook
from diode.kafka import identity, lineage
from diode.kafka.claims import ClaimSlices
from diode.kafka.clients import consumer_config, replicated
from diode.kafka.metadata import MetadataWatcher, Sent
from diode.kafka.refresh import PartitionWatcher
from diode.kafka.offsets import SentTracker
from diode.runtime.worker import Stage as BaseStage

BATCH_RECORDS = 1000
MAX_DIGESTS_WAITING = 10000  # digests closed while the packers took nothing (then the oldest go)
REFRESH_TAKE_SECONDS = 0.1  # how often the loop takes what the partition watcher found
STOPPING_BEAT_SECONDS = 0.1
ACK_WAIT_MS = 20  # how long a turn that reads nothing waits for acknowledgements
POSITIONS_PER_COMMIT = 500  # partitions with nothing in flight whose consumer position a
#                             commit asks, in turn (_consumed_past_last_record)
FETCHED_ENDS_PER_LOOK = 1000  # partitions whose fetched end is taken after a look, at most
MARKS_SECONDS = 0.02  # how long the watermarks handed to the watcher, or the ends fetched after
#                       a look (_fetched_ends), are taken for, at most
WAITING_LOG_SECONDS = 60.0  # how often partitions the source has not answered for are told
SOURCE_WHOLE_LOOKS = 6  # every this many looks at the source's state, all of it is sent
LOGGED_PARTITIONS = 20      # partitions named in a log line (then how many more)


class Stage(BaseStage):
    # A clean stop says so: after its last records, the reader sends this many heartbeats
    # marked stopping (wire.FLAG_STOPPING), STOPPING_BEAT_SECONDS apart (UDP may drop one), so
    # the receiver logs that the sender stopped instead of warning of a silent link.
    STOPPING_BEATS = 3
    PARTITION_EOF = False  # whether the consumer reports the end of each partition it reaches
    TAKES_INPUT_WHILE_STOPPING = False  # (a head stage: stopping, it reads nothing more)

    def open(self):
        s = self.t.sender
        # sender.schemas: the registry's topic is one more named topic (never a dead-letter
        # topic: the topology refuses that), read from its first record (_refresh)
        self.schemas_topic = s.schemas_topic if s.schemas else None
        self.selector = replicated(s, self.ctx.spec.index, self.ctx.instances("kafka_reader"))
        self.consumer = Consumer({**consumer_config(self.t), "on_commit": self._committed,
                                  "enable.partition.eof": self.PARTITION_EOF})
        self.acks = transport.pull(self.ctx.zmq, self.ctx.bound("acks"), self.ctx.hwm * 16)
        self.out = self.outbox(transport.push(self.ctx.zmq, self.ctx.peers("out"),
                                              self.ctx.hwm))
        self.tracker = SentTracker()
        self.position_committed: dict = {}  # (topic, partition) -> last offset committed
        self.assigned: dict = {}          # (topic, partition) -> start offset when assigned
        # The chain of offsets sent per partition (diode.accounting.ordering): where the current
        # chain started and the last offset dispatched; both forgotten when the reader rewinds.
        self.chain_start: dict = {}
        self.last_read: dict = {}
        # stopping (finish): the heartbeats marked stopping sent so far, when the next is due,
        # and whether every digest was closed (at its first turn)
        self.stopping_beats, self.stopping_beat_due, self.digests_closed = None, 0.0, False
        self.counts: dict = {}            # topic -> partition count
        # The incarnations of the sources read (diode.kafka.lineage), and what a reader before
        # this restart knew of them.
        self.lineage = lineage.Lineage()
        # what each heartbeat claims: what changed, a slice of the rest (diode.kafka.claims)
        self.claims = ClaimSlices(s.heartbeat_claims_max)
        self.remember_due = True  # what a restart needs to know changed (_memorize)
        self.read_since: set = set()      # partitions read since their fetched ends were taken
        self.held_back = False            # since the watcher last had the fetches' watermarks
        self.marks: dict = {}             # (topic, partition) -> its fetches' watermarks (_marks)
        self.marks_turn = 0               # where the next _marks goes on from
        self.read_topics: set = set()     # topics read since the watcher was last told
        self.position_turn = 0            # where the next commit's slice of positions starts
        self.waiting: dict = {}           # partitions the watcher's last look could not hand
        #                                   over (the source did not answer for them) -> why
        self.waiting_told = 0.0           # when they were last logged
        self.out_of_range: dict = {}      # (topic, partition) whose position the source lost
        #                                   -> when that was seen
        self.epoch = int.from_bytes(os.urandom(3), "big") << 32
        self.seq = 0
        self.meta_sent = Sent()
        # what was last sent of the source's state (_source_state): (topic, partition) ->
        # [incarnation, log start, end], topic -> its settings; how many looks were sent
        self.source_sent: dict = {}
        self.settings_sent: dict = {}
        self.source_looks = 0
        self.look = None  # the metadata watcher's latest look
        self.look_sent = False  # whether what it changed was sent
        self.whole_wanted = False  # everything is sent with the next metadata (self.whole)
        self.consumed: list | None = None  # what the turn's consume call returned
        self.digests: deque = deque(maxlen=MAX_DIGESTS_WAITING)  # closed, not yet handed on
        self.watcher = self.metadata = self.digester = self.keeper = None
        self._watch_source()
        self.waiting_since = None         # when acknowledgements were last outstanding and new
        self._deadlines()

    def _deadlines(self) -> None:
        """The loop's timers, in the order they run at the start of a turn (before reading):
        the heartbeat (the first goes before any record), reader 0's whole metadata, what the
        watchers found, the commit. None acts while stopping: finish() does what is left."""
        s = self.t.sender
        self.every(s.heartbeat_interval_ms / 1000, self._beat)
        if self.metadata is not None:
            self.whole = self.every(s.metadata_interval_ms / 1000, self._want_whole)
        self.every(REFRESH_TAKE_SECONDS, self._take_found)
        commit = s.offset_commit_interval_ms / 1000
        self.every(commit, self._commit_due, first=time.monotonic() + commit)

    def _watch_source(self) -> None:
        """Look at the source off this loop: its topics, partitions and identities (the
        watcher, diode.kafka.refresh), for reader 0 its metadata (diode.kafka.metadata); and
        keep the digests of what is read (diode.accounting.digests)."""
        s = self.t.sender
        self.memory = lineage.memory_path(self.ctx.run_dir, self.selector.index)
        remembered = self._remember()
        self.keeper = lineage.Keeper(self.memory, self.t.name, self.selector.readers, self.log)
        self.watcher = PartitionWatcher(
            consumer_config(self.t), self.selector.owned, s.refresh_topics_interval_seconds,
            s.identity_check_interval_ms / 1000, remembered,
            s.source_state_interval_ms / 1000, marked=True).start()
        if self.selector.index == 0:
            self.metadata = MetadataWatcher(
                consumer_config(self.t), self.selector.matches, s.metadata_topic_configs,
                [re.compile(p) for p in s.groups], s.refresh_topics_interval_seconds).start()
        if s.digest_records:
            self.digester = Digester(s.digest_records, s.digest_interval_ms / 1000)

    # -- partitions --------------------------------------------------------------------------

    def _refresh(self):
        """Start reading the partitions the watcher found (it asks the cluster off this loop,
        every refresh.topics.interval.seconds)."""
        if self.read_topics:  # (their ids are checked at the next look)
            self.watcher.read(self.read_topics)
            self.read_topics = set()
        if self.watcher.wants_marks():
            self.watcher.give_marks(None if self.held_back else self._marks())
            self.held_back = False
        start = OFFSET_BEGINNING if self.t.sender.start_position == "earliest" else OFFSET_END
        tps, looked = [], False
        for found in self.watcher.take():
            if found.error is not None:
                self.log.warning("cannot read the source cluster's topics or committed offsets "
                                 "(%s); retrying", found.error)
                self.metrics.inc("errors", reason="metadata")
                continue
            looked = True
            self._waiting(found.waiting)
            if found.counts:
                self.counts = found.counts
            if found.cluster != self.lineage.cluster:
                self.lineage.cluster, self.lineage.changed = found.cluster, True
            for topic in found.gone:
                self._gone(topic)
            for topic, (old, new) in found.resets.items():
                self._recreated(topic, old, new)
            self.lineage.confirmed(found.incarnations, found.ends, found.started, found.whole)
            if self.lineage.wants_fetched():
                self.lineage.fetched_now(self._fetched_ends())
            if found.starts or found.settings:
                self._source_state(found)
            for topic, partition, offset in found.stale:
                self.log.warning("%s[%d]: the offset committed (%d) is not known to be this "
                                 "incarnation's (another's, or committed by name while the "
                                 "topic was recreated): not used", topic, partition, offset)
            self._renew_out_of_range(found)
            for t in {tp[0] for tp, end in found.ends.items() if tp[0] in found.unnamed and
                      end < self.last_read.get(tp, -1) + 1}:
                self.watcher.renew(t)  # (no topic id: its offsets went back, so recreated)
            anew = []
            for tp in found.new:
                if (tp.topic, tp.partition) in self.assigned:
                    continue
                # a recreated topic is read whole, and so is the registry's (its ids are
                # assigned in the order of its log); one seen for the first time from
                # sender.start.position
                first = OFFSET_BEGINNING if tp.topic in self.lineage.recreated or \
                    tp.topic == self.schemas_topic else start
                offset = tp.offset if tp.offset >= 0 else first
                self.assigned[(tp.topic, tp.partition)] = offset
                tps.append(TopicPartition(tp.topic, tp.partition, offset))
                if tp.topic in found.resets and tp.offset < 0:
                    anew.append(TopicPartition(tp.topic, tp.partition, 0, metadata=(
                        identity.metadata(found.incarnations[tp.topic]))))
            self._commit_start(anew)
        if looked and (self.lineage.changed or self.remember_due):
            # What a look taught (an end, a recreation) is recorded at once, not at the next
            # heartbeat: a reader killed meanwhile (on Tansu, librdkafka kills it as its topic
            # is deleted) restarts from it, and claims the old incarnation's end it had seen.
            self._memorize()
        if not tps:
            return
        self.remember_due = True
        self.consumer.incremental_assign(tps)
        self.log.info("reading %d new partition(s): %s", len(tps), _named(
            [f"{t.topic}[{t.partition}]@{_where(t.offset)}" for t in tps]))
        self.metrics.set("partitions", len(self.assigned))

    def _waiting(self, waiting: dict) -> None:
        """Partitions the watcher could not hand over yet (the source did not answer for them:
        a leader not elected yet, a coordinator loading): told when they come and every
        WAITING_LOG_SECONDS while they last, and when the last of them is read."""
        now = time.monotonic()
        if waiting and (not self.waiting or now - self.waiting_told >= WAITING_LOG_SECONDS):
            self.waiting_told = now
            why = sorted(set(waiting.values()))
            self.log.warning(
                "%d source partition(s) not read yet: the source cluster did not answer for "
                "them (%s); the others are read meanwhile, and these are asked for again at "
                "every look: %s", len(waiting), "; ".join(why[:3]) + (" ..." if why[3:] else ""),
                _named([f"{t}[{p}]" for t, p in sorted(waiting)]))
        elif self.waiting and not waiting:
            self.log.info("the source cluster answered for the %d partition(s) it had not: "
                          "every partition found is read", len(self.waiting))
        self.waiting = waiting

    # -- the source's identity ---------------------------------------------------------------

    def _recreated(self, topic: str, old: bytes, new: bytes) -> None:
        """`topic` is another incarnation now (recreated, or its cluster rebuilt): stop reading
        the old one, tell of it in the heartbeats (a retired claim per partition), read the new
        one whole."""
        self._stop_reading(topic)
        claims = self.lineage.recreate(topic, old)
        self.metrics.inc("source_resets")
        self.log.warning("source topic %s is a new incarnation (topic id %s, was %s): it was "
                         "deleted and recreated, or its cluster rebuilt; reading it from its "
                         "first record. The receiver reports what never crossed of the old one "
                         "(%d partition(s)) as source-reset", topic, identity.text(new),
                         identity.text(old), claims)

    def _gone(self, topic: str) -> None:
        """`topic` is no longer in the cluster: stop reading it (it may come back, as the same
        incarnation or another). Where its chains stood is kept for a retired claim."""
        self._stop_reading(topic)
        self.log.warning("source topic %s is gone from the source cluster: not reading it "
                         "until it comes back", topic)

    def _stop_reading(self, topic: str) -> None:
        """Stop reading every partition of `topic`; where each stood is the lineage's."""
        tps = [tp for tp in self.assigned if tp[0] == topic]
        if tps:
            try:
                self.consumer.incremental_unassign([TopicPartition(*tp) for tp in tps])
            except KafkaException as exc:
                self.log.warning("could not stop reading %s: %s", topic, exc)
        positions = self.tracker.positions()
        self.remember_due = True
        for tp in tps:
            if self.digester is not None:
                self.digester.forget(tp)
            sent = self._sent(tp, positions)
            self.lineage.depart(tp, self.chain_start.pop(tp, None), self.last_read.pop(tp, None),
                                sent, self.assigned.pop(tp), self.tracker.forget(tp))
            self.out_of_range.pop(tp, None)
        self.metrics.set("partitions", len(self.assigned))

    def _renew_out_of_range(self, found) -> None:
        """Partitions whose position the source no longer held, now that the watcher has
        looked since: a topic found recreated was handled as such; any other is read again
        from its start, in a new chain (the receiver reports what that skipped)."""
        for tp, seen in sorted(self.out_of_range.items()):
            if tp not in self.assigned:
                del self.out_of_range[tp]
                continue
            went_back = tp[0] in found.unnamed and \
                found.ends.get(tp, 1 << 62) < self.last_read.get(tp, -1) + 1
            if found.started < seen or went_back:
                continue  # (a look from before; or no topic id and offsets went back: renewed
                #            below, then found recreated)
            del self.out_of_range[tp]
            self.log.warning("%s[%d]: the source no longer holds offset %s (retention deleted "
                             "records before they were read, or the log was truncated): reading "
                             "the partition from its start", tp[0], tp[1],
                             self.last_read.get(tp, -1) + 1)
            self.tracker.forget(tp)
            self.chain_start.pop(tp, None)
            self.last_read.pop(tp, None)
            self.assigned[tp] = OFFSET_BEGINNING
            self.remember_due = True
            try:
                self.consumer.incremental_unassign([TopicPartition(*tp)])
                self.consumer.incremental_assign([TopicPartition(*tp, OFFSET_BEGINNING)])
            except KafkaException as exc:
                self.log.warning("could not read %s[%d] again: %s", tp[0], tp[1], exc)

    def _fetched_ends(self) -> dict:
        """The end of each partition read since the last call, as this reader's own fetches
        saw it (no request is made), taken for MARKS_SECONDS at most (and of
        FETCHED_ENDS_PER_LOOK partitions at most): each costs librdkafka a search of every
        topic, 0.35 ms a partition at 2 000 topics, and 1 000 of them held the loop 6.8 s on
        a loaded machine; the rest are taken at the next looks. (One not read since: what its
        fetches saw was taken then, or it had nothing to read, and its listed end is the
        watcher's.)"""
        highs = {}
        until = time.monotonic() + MARKS_SECONDS
        for tp in list(islice(self.read_since, FETCHED_ENDS_PER_LOOK)):
            self.read_since.discard(tp)
            if tp in self.assigned:
                marks = self._fetched(tp)
                if marks is not None:
                    highs[tp] = marks[1]
            if time.monotonic() >= until:
                break  # (bounded: the rest at the next looks)
        return highs

    def _fetched(self, tp: tuple) -> tuple | None:
        """(log start, end) of a partition as this reader's last fetch of it saw them (no
        request is made); None when it was not fetched yet."""
        try:
            lo, hi = self.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
        except KafkaException:
            return None
        return (lo, hi) if lo >= 0 and hi >= 0 else None

    def _marks(self) -> dict:
        """(topic, partition) -> (log start, end) of each partition read, as this reader's own
        fetches saw them (no request is made: every fetch response carries them, and an idle
        consumer fetches every partition every fetch.wait.max.ms); a partition not fetched yet
        is left out. The watcher lists only the partitions whose watermarks moved
        (diode.kafka.refresh). Taken in turn for MARKS_SECONDS at most, the others' as taken
        before: librdkafka searches every topic at each call (1 000 partitions of 200 topics:
        1.5 ms in all; 10 000 of 2 000: 3.5 s, so about 60 a look), and the loop must not
        stop for that (the watcher's turn lists every partition within its looks anyway)."""
        if len(self.marks) > len(self.assigned):
            self.marks = {tp: m for tp, m in self.marks.items() if tp in self.assigned}
        order = list(self.assigned)
        n, until = len(order), time.monotonic() + MARKS_SECONDS
        for i in range(n):
            tp = order[(self.marks_turn + i) % n]
            marks = self._fetched(tp)
            if marks is not None:
                self.marks[tp] = marks
            else:
                self.marks.pop(tp, None)
            if time.monotonic() >= until:
                self.marks_turn = (self.marks_turn + i + 1) % n
                break
        return dict(self.marks)

    def _commit_start(self, tps: list) -> None:
        """Commit the start of a recreated topic's partitions at once: what the group held for
        them may be the old incarnation's positions (committed by name while it was being
        recreated), which a restart on a broker that keeps no commit metadata would take."""
        if not tps:
            return
        try:
            self.consumer.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            self.log.warning("could not commit the start of %s: %s", tps[0].topic, exc)

    def _sent(self, tp, positions: dict) -> int:
        """The last offset of `tp` handed to the kernel (before its chain's start: nothing)."""
        return lineage.sent(tp, positions, self.chain_start)

    def _remember(self) -> dict:
        """What this reader knew before it was restarted (diode.kafka.lineage); returns the
        incarnations it read, for the watcher to compare with the source's."""
        saved = lineage.load(self.memory, self.t.name, self.selector.readers)
        if saved is None:
            return {}
        self.lineage.restore(saved)
        self.log.info("what this reader knew before its restart: %d topic(s), %d partition(s), "
                      "%d retired claim(s)", len(saved["topics"]), len(saved["partitions"]),
                      len(saved["retired"]))
        return saved["topics"]

    def _memorize(self) -> None:
        """Record what a restart of this reader needs to know (diode.kafka.lineage): at a
        heartbeat, when it changed (records read or sent, partitions assigned or not, the
        lineage's ends and claims). The loop takes a picture of it (copies); its keeper's
        thread writes it."""
        self.remember_due = self.lineage.changed = False
        self.keeper.keep(self.lineage.picture(self.assigned, self.chain_start, self.last_read,
                                              self.tracker.positions()))

    def rewind(self):
        """Read again everything after the committed positions."""
        positions = self.tracker.positions()
        lost = self.tracker.inflight
        self.tracker.reset()
        self.lineage.lost_inflight()
        self.remember_due = True
        self.chain_start.clear()
        self.last_read.clear()
        if self.digester is not None:
            self.digester.forget()
        self.epoch += 1 << 32  # acknowledgements of earlier messages are ignored from now
        self.out.clear()
        tps = [TopicPartition(t, p, positions.get((t, p), start))
               for (t, p), start in self.assigned.items()]
        if tps:
            self.consumer.assign(tps)
        self.waiting_since = None
        self.metrics.inc("rewinds")
        self.log.warning("rewound %d partition(s) to the committed positions: %d record(s) in "
                         "flight are read again", len(tps), lost)

    # -- its deadlines (timers: diode.runtime.worker.Stage.every) ----------------------------

    def _beat(self, now: float) -> None:
        """A heartbeat, at the start of a turn: before reading, so the first goes before any
        record and a receiver that hears it accounts every chain of this reader from its start
        (diode.accounting.ordering). Not while stopping: finish() sends its own."""
        if not self.stopping:
            self._heartbeat()

    def _want_whole(self, now: float) -> None:
        """Reader 0: everything goes with the next metadata sent (_send_metadata), which
        moves this timer to sender.metadata.interval.ms after it."""
        self.whole_wanted = True

    def _take_found(self, now: float) -> None:
        """Take what the watchers found: partitions to read (_refresh), reader 0's metadata.
        Not while stopping."""
        if self.stopping:
            return
        self._refresh()
        if self.metadata is not None:
            self._send_metadata(now)

    def _commit_due(self, now: float) -> None:
        """Commit what was sent (not while stopping: finish() commits once, at the end)."""
        if not self.stopping:
            self._commit()

    # -- what the runtime's loop calls (diode.runtime.worker.Stage.step) ---------------------

    def before_input(self, now: float) -> int | None:
        """First at every turn, stopping or not: the acknowledgements. Then, unless stopping
        (finish() is next): rewind if they stopped coming; read, unless the packers or the
        records in flight are full (None: then it has waited a moment for acknowledgements)."""
        self._take_acks()
        if self.stopping:
            return None
        self._check_stalled(now)
        if self.out.flush() and self.tracker.inflight < self.t.sender.max_inflight_records:
            return self.POLL_MS
        self.held_back = True  # (its consumer stops fetching what waits: watermarks lag)
        self.acks.poll(ACK_WAIT_MS)
        return None

    def poll_input(self, wait_ms: int) -> list:
        """One consume call, waiting up to `wait_ms` for records; with nothing assigned (no
        partition yet, or none left), a moment's wait for acknowledgements instead."""
        if not self.assigned:
            self.acks.poll(ACK_WAIT_MS)
            return []
        self.consumed = self.consumer.consume(BATCH_RECORDS, timeout=wait_ms / 1000)
        return self.consumed

    def take_input(self) -> None:
        msgs, self.consumed = self.consumed, None
        self._send_records(self._records(msgs))

    def _send_records(self, msgs: list) -> None:
        """The records of one consume call to a packer, as one message: a run per partition."""
        # grouped by partition without a Python frame per message
        groups: dict = {}  # (topic, partition) -> its messages, in offset order
        where = zip(map(Message.topic, msgs), map(Message.partition, msgs))
        for tp, same in groupby(zip(where, msgs), itemgetter(0)):
            groups.setdefault(tp, []).extend(map(itemgetter(1), same))
        if not groups:
            return
        frames, parts, counts = [], [], []
        for (topic, partition), group in groups.items():
            tp = (topic, partition)
            count = max(self.counts.get(topic, 0), partition + 1)
            first, last = group[0].offset(), group[-1].offset()
            prev = self._chain(tp, first, last)
            frames.append(runs.from_messages(topic, partition, count, prev, group,
                                             self.lineage.incarnation(topic)))
            parts.append((tp, last, len(group)))
            counts.append(len(group))
            if self.digester is not None:
                self.digests.extend(self.digester.add(
                    tp, self.lineage.incarnation(topic), list(map(Message.offset, group)),
                    message_hashes(group), time.monotonic()))
        self.seq += 1
        msg_id = self.epoch | self.seq
        self.tracker.dispatched(msg_id, parts)
        self.out.put([Runs(self.ctx.spec.index, msg_id, counts).encode(), *frames])
        self.metrics.inc("records", sum(counts))
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def _records(self, msgs: list) -> list:
        """The records to send of what one consume call returned."""
        if any(map(Message.error, msgs)):  # (the common case skips this pass)
            return [m for m in msgs if self._to_send(m)]
        return msgs

    def _chain(self, tp, first: int, last: int) -> int:
        """Records first..last of `tp`, read now, join its chain (diode.accounting.ordering):
        the offset before them in the chain (-1: they start one)."""
        prev = self.last_read.get(tp, -1)
        self.last_read[tp] = last
        self.read_since.add(tp)
        self.read_topics.add(tp[0])
        self.remember_due = True
        self.chain_start.setdefault(tp, first)
        return prev

    def _to_send(self, m) -> bool:
        """Whether a consumed message is a record to send: errors are dealt with here."""
        err = m.error()
        if err is None:
            return True
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            # The source no longer holds this partition's position (auto.offset.reset is
            # "error"): recreated, or records deleted before they were read. The watcher looks
            # now; the loop decides when it has (_renew_out_of_range).
            tp = (m.topic(), m.partition())
            if tp in self.assigned and tp not in self.out_of_range:
                self.out_of_range[tp] = time.monotonic()
                self.watcher.wake()
        else:
            self.log.warning("source cluster: %s", err)
            self.metrics.inc("errors", reason="consume")
        return False

    def _source_state(self, found) -> None:
        """Send what a look at the source found (wire.KIND_SOURCE): per partition read, its
        incarnation, log start and end (the larger of the listed end and what fetches saw:
        lineage.ends), per topic its retention settings. What changed since it was last sent
        (a partition, or every partition of a topic whose settings changed), and all of it
        every SOURCE_WHOLE_LOOKS looks: the receiver keeps what a look does not name
        (diode.writer.source_view), and one that started late or lost a datagram has it all
        within SOURCE_WHOLE_LOOKS looks."""
        ends = self.lineage.ends
        parts = [[t, p, found.incarnations[t], start, max(ends.get((t, p), 0), start)]
                 for (t, p), start in sorted(found.starts.items()) if t in found.incarnations]
        if not parts or self.out.full:
            return  # (the next look sends it again)
        whole = not self.source_looks % SOURCE_WHOLE_LOOKS
        self.source_looks += 1
        settings = found.settings
        if whole:  # (what was sent is forgotten: bounded by what is read now)
            self.source_sent, self.settings_sent = {}, {}
        else:
            topics = {t for t, said in settings.items() if self.settings_sent.get(t) != said}
            parts = [e for e in parts
                     if e[0] in topics or self.source_sent.get((e[0], e[1])) != e[2:]]
            if not parts:
                return
            settings = {t: settings[t] for t in {e[0] for e in parts} if t in settings}
        state = {"reader": self.ctx.spec.index, "time_ms": int(time.time() * 1000),
                 "cluster": self.lineage.cluster, "partitions": parts,
                 "topics": [[t, *settings[t]] for t in sorted(settings)]}
        self.out.put([SourceLook(state).encode()])
        self.source_sent.update(((t, p), entry) for t, p, *entry in parts)
        self.settings_sent.update(settings)

    def _send_metadata(self, now: float) -> None:
        """The source's metadata (wire.KIND_METADATA) as the watcher last found it: what
        changed since it was last sent, or all of it every sender.metadata.interval.ms."""
        for look in self.metadata.take():
            if look.error is not None:
                self.log.warning("cannot read the source cluster's metadata (%s); retrying",
                                 look.error)
                self.metrics.inc("errors", reason="metadata")
            else:
                self.look, self.look_sent = look, False
        whole = self.whole_wanted
        if self.look is None or self.out.full or (self.look_sent and not whole):
            return  # (not sent: the next look tries again, _take_found; or sent already)
        topics, positions = self.meta_sent.changes(self.look, whole)
        self.look_sent = True  # (what changed in it is compared once, not at every turn)
        if not topics and not positions:
            return
        look = self.look
        self.out.put([MetadataLook({
            "reader": self.ctx.spec.index, "time_ms": look.time_ms, "cluster": look.cluster,
            "whole": whole, "topics": topics, "groups": positions}).encode()])
        self.meta_sent.sent(look)
        self.metrics.inc("metadata_sent")
        if whole:
            self.whole_wanted = False
            self.whole.at(now + self.t.sender.metadata_interval_ms / 1000)

    def _send_digests(self, now: float) -> None:
        """The digests closed, and those of ranges open long enough, to the packers
        (wire.KIND_DIGEST)."""
        self.digests.extend(self.digester.due(now))
        if not self.digests or self.out.full:
            return  # (kept for the next heartbeat: the deque holds MAX_DIGESTS_WAITING)
        self._hand_digests()

    def _hand_digests(self, resend: bool = False) -> None:
        batch = {"reader": self.ctx.spec.index, "time_ms": int(time.time() * 1000),
                 "cluster": self.lineage.cluster, "resend": resend,
                 "partitions": [tuple(d) for d in self.digests]}
        self.digests.clear()
        self.out.put([DigestBatch(batch).encode()])
        self.metrics.inc("digests", len(batch["partitions"]))

    def _heartbeat(self, stopping: bool = False) -> bool:
        """Claims (diode.kafka.claims): per partition of the current chains, its incarnation,
        where the chain started, the last offset handed to the kernel (the committed prefix)
        and the last the source held when last looked at; then the retired claims of
        incarnations gone this last day. Those that changed since last claimed, and a slice of
        the others in turn; all of them when `stopping` (the reader is stopping cleanly: sent
        after its last records). With each, when its chain was first named (`named_ms`: the
        time of the first heartbeat handed on that carried it). The packer that takes it sends it after whatever it holds.
        True when it was handed on."""
        positions = self.tracker.positions()
        ends, incarnations = self.lineage.ends, self.lineage.incarnations
        none = identity.NO_INCARNATION
        claims = [(t, p, incarnations.get(t, none), start, positions[(t, p)] - 1,
                   ends.get((t, p), 0) - 1, False)
                  for (t, p), start in self.chain_start.items()
                  if positions.get((t, p), start) - 1 >= start]
        claims += self.lineage.claims(self.tracker.sent)
        parts = self.claims.choose(claims, whole=stopping)
        now_ms = int(time.time() * 1000)
        beat = {"reader": self.ctx.spec.index, "time_ms": now_ms,
                "interval_ms": self.t.sender.heartbeat_interval_ms, "partitions": parts,
                "named_ms": self.claims.named_at(parts, now_ms),
                "cluster": self.lineage.cluster,
                "counters": {"records": self.metrics.get("records"),
                             "rewinds": self.metrics.get("rewinds"),
                             "inflight": self.tracker.inflight},
                "stopping": stopping}
        sent = not self.out.full
        if sent:
            self.out.put([Heartbeat(beat).encode()])
            self.metrics.inc("heartbeats")
            self.claims.carried_now(parts, now_ms)
        if self.digester is not None:
            self._send_digests(time.monotonic())
        if self.remember_due or self.lineage.changed or self.claims.changed or stopping:
            self._memorize()
        return sent

    def _take_acks(self):
        progressed = False
        for (frame,) in transport.drain(self.acks):
            for msg_id, count in Acks.decode(frame).acks:
                self.tracker.acknowledged(msg_id, count)
                progressed = True
        if progressed:
            self.remember_due = True
            self.waiting_since = time.monotonic() if self.tracker.inflight else None
        self.metrics.set("inflight_records", self.tracker.inflight)

    def _check_stalled(self, now):
        timeout = self.t.sender.inflight_timeout_seconds
        if self.waiting_since is not None and self.tracker.inflight \
                and now - self.waiting_since > timeout:
            self.log.warning("no record acknowledged as sent for %.0f s", timeout)
            self.rewind()

    def _commit(self, sync=False):
        changed = self.tracker.take_changed()
        changed.update(self._consumed_past_last_record(changed))
        if not changed:
            return
        tps = [TopicPartition(t, p, offset, metadata=identity.metadata(
            self.lineage.incarnation(t))) for (t, p), offset in changed.items()
            if (t, p) in self.assigned]
        try:
            self.consumer.commit(offsets=tps, asynchronous=not sync)
            self.metrics.inc("commits")
            self.position_committed.update(changed)
        except Exception as exc:
            self.log.warning("offset commit failed (%s); the next one covers it", exc)
            self.metrics.inc("errors", reason="commit")
            self.tracker.retry(changed)  # the next commit covers these
            self.position_committed.clear()

    def _consumed_past_last_record(self, changed: dict) -> dict:
        """Commit positions beyond the last record sent: a partition with nothing in flight is
        consumed up to the consumer's position, and what lies between its last record and that
        position holds nothing to send (transaction markers, aborted records). Without this a
        transactional topic would show a lag of 1 (its last commit marker) forever. Asked of
        the partitions whose sent position moved (`changed`) and of POSITIONS_PER_COMMIT
        others, in turn (each within ceil(partitions / POSITIONS_PER_COMMIT) commits), those
        of them whose end, as last looked at, lies past what was sent and committed: an idle
        reader asks the consumer nothing (its position() costs a search of every topic per
        partition in librdkafka: a third of a core for 10 000 partitions every second)."""
        n = len(self.assigned)
        turn = self.position_turn % n if n else 0
        ask = list(islice(self.assigned, turn, turn + POSITIONS_PER_COMMIT))
        if len(ask) < POSITIONS_PER_COMMIT:
            ask += list(islice(self.assigned, 0, min(turn, POSITIONS_PER_COMMIT - len(ask))))
        self.position_turn = turn + POSITIONS_PER_COMMIT
        sent, ends, done = self.tracker.positions(), self.lineage.ends, self.position_committed
        idle = [TopicPartition(t, p) for (t, p) in dict.fromkeys([*changed, *ask])
                if (t, p) in self.assigned and self.tracker.idle((t, p)) and
                ends.get((t, p), 0) > max(sent.get((t, p), 0), done.get((t, p), 0))]
        del idle[POSITIONS_PER_COMMIT:]  # (bounded: the rest come in turn)
        if not idle:
            return {}
        out = {}
        for tp in self.consumer.position(idle):
            key = (tp.topic, tp.partition)
            if tp.offset > sent.get(key, -1) and tp.offset > self.assigned[key] and \
                    tp.offset != self.position_committed.get(key):
                out[key] = tp.offset
        return out

    def _committed(self, err, partitions):
        """Commit result (served by consume()): failed positions are committed again."""
        failed = [(tp.topic, tp.partition) for tp in partitions if err or tp.error]
        if failed:
            self.position_committed.clear()
            self.log.warning("offset commit failed (%s); retrying", err or partitions[0].error)
            self.metrics.inc("errors", reason="commit")
            self.tracker.retry(failed)

    def finish(self, now):
        """Stopping (the loop reads nothing more): wait until `finish_by` for what is in flight
        to be sent, commit, say so in STOPPING_BEATS heartbeats marked stopping (after the last
        records), STOPPING_BEAT_SECONDS apart, finish a moment after the last. (Their deadline is
        an attribute of its own, not a timer: it is kept only once the commit is made and the
        packers have taken what was handed on, which a timer, run before each turn, knows not.)"""
        if self.digester is not None and not self.digests_closed:
            self.digests_closed = True  # (what was read is sent before the packers stop)
            self._send_digests(float("inf"))
        flushed = self.out.flush()
        if self.tracker.inflight and now < self.finish_by:
            self.acks.poll(ACK_WAIT_MS)
            return True
        if self.stopping_beats is None:  # (once: what was sent is committed)
            if self.tracker.inflight:
                self.log.warning("stopping with %d record(s) not acknowledged as sent: they are "
                                 "read again at the next start", self.tracker.inflight)
            self._commit(sync=True)
            self.stopping_beats, self.stopping_beat_due = 0, now
            self.finish_by = max(self.finish_by, now + 1.0)
        if now >= self.finish_by or not self.STOPPING_BEATS:
            return False
        if now < self.stopping_beat_due or not flushed:
            time.sleep(0.01)  # (the last one too has a moment to reach its packer)
            return True
        if self.stopping_beats < self.STOPPING_BEATS and self._heartbeat(stopping=True):
            self.stopping_beats += 1
            self.stopping_beat_due = now + STOPPING_BEAT_SECONDS
        return self.stopping_beats < self.STOPPING_BEATS or now < self.stopping_beat_due

    def close(self):
        if self.watcher is not None:
            self.watcher.close()
        if self.metadata is not None:
            self.metadata.close()
        if self.keeper is not None:
            self.keeper.close()  # (what was handed last is written first)
        self.consumer.close()


def _named(names: list) -> str:
    """The first LOGGED_PARTITIONS of `names`, and how many more (a log line stays short)."""
    more = len(names) - LOGGED_PARTITIONS
    return ", ".join(names[:LOGGED_PARTITIONS]) + (f" and {more} more" if more > 0 else "")


def _where(offset):
    return {OFFSET_BEGINNING: "earliest", OFFSET_END: "latest"}.get(offset, offset)
