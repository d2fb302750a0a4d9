"""The destination: what the writer hands the destination cluster, and what it says back.

It owns the backlog (runs decoded and not yet all produced, an Entry each, in order; a
partition's consecutive runs joined into one Entry as they are added; the runs of a destination
topic not writable yet parked apart, by topic, until it is, and those of a destination partition
not taking records yet, by source partition, until the Preparer answers it ready), the records
producer (produce, acknowledgements, end-to-end latency marks), the runs produced since the last
checkpoint (to name a refused record: a delivery report carries no headers), dead letters and
refusals, the destination topics (their partition counts, asked of the Preparer, and their
trouble: a topic refused for good or unanswered for TOPIC_GIVE_UP_SECONDS is given up, its
records dead letters), and the events producer with its bounded queue (missing ranges,
heartbeats, digests, dead letters). It does not decide what to write (the partitions' states,
diode.accounting.ordering, do) nor what an event says (diode.writer.reporter builds the
missing-records events and reports refusals through `report_refused`).

Delivery reports come for errors only (delivery.report.only.error): what was written is what was
produced, less what librdkafka still holds, less what failed. Events go through a producer of
their own, so that count stays exact.
"""

import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException

from diode.kafka.clients import produce_run
from diode.kafka.messages import (Provenance, dead_letter_headers, provenance_headers,
                                  written_at_header)
from diode.kafka.preparer import METADATA_TIMEOUT, PartitionsReady, TopicAnswer
from diode.link.runs import FRAMING_ALLOWANCE, Run

MAX_PARTITIONS = 10000
# receiver.schemas.topic, when the writer creates it: a schema registry refuses to start on a
# topic that is not compacted (or has more than 1 partition: ensure_topic asks for 1)
SCHEMAS_TOPIC_CONFIG = {"cleanup.policy": "compact"}
MAX_SENT_RUNS = 256          # the runs produced last, kept to name a refused record (refusals come
#                              within a round trip; each run holds its datagram in memory)
WRITER_LINGER_MS = 50        # librdkafka's linger.ms unless receiver.kafka sets it
FLUSH_STEP_SECONDS = 0.02    # a flush waits this long per step (twice at most: records, events)
METADATA_AGAIN_SECONDS = 1.0  # a destination topic not known yet is asked about this often
GROW_AGAIN_SECONDS = 60.0  # a destination topic with fewer partitions than its source's, same
TOPIC_GIVE_UP_SECONDS = 60.0  # a destination topic the cluster answers for and will not
#                               create or describe this long: dead letters
MAX_JOINED_RECORDS = 4096    # consecutive runs of a partition are produced as one, up to this
PARKED_AGAIN_SECONDS = 0.25  # the runs of a topic not writable yet are looked at this often
MAX_LATENCY_MARKS = 4096     # runs produced and not yet acknowledged whose latency is still due
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


class Columns(NamedTuple):
    """A run's columns as produced, built once when its first record is offered."""
    keys: list
    values: list
    own: list | None   # the records' own headers (Run.header_lists)
    headers: list      # as written: own, provenance, written-at, the ticket (provenance_headers)


@dataclass(slots=True)
class Entry:
    """A run in the backlog: produced up to `done` (a full queue's retry resumes there). While
    none of it is produced, the partition's next runs of the same chain are joined to it
    (`more`, Destination.add; joined into `run` when it is first produced: `whole`), up to
    MAX_JOINED_RECORDS (`records`); `more` None: no more joins."""
    run: Run
    done: int = 0
    columns: Columns | None = None
    extra: tuple = ()   # headers of its own: a resent run's ticket
    more: list | None = None
    records: int = 0

    def whole(self) -> Run:
        """The run with those joined to it, in one (Run.join); closed to joins from now on."""
        if self.more:
            self.run = Run.join([self.run, *self.more])
        self.more = None
        return self.run


class Sent(NamedTuple):
    """A run produced since the last checkpoint, to name a refused record of it."""
    topic: str
    run: Run
    keys: list
    values: list
    own: list | None


class Destination:
    def __init__(self, settings, metrics, log, new_producer, name_of, source_partitions: dict,
                 report_refused, ask_topic=None, schemas_topic: str | None = None):
        """`settings`: the receiver's; `new_producer(**config)` makes a producer (the records',
        at once, and the events' when first needed); `name_of(source topic)`: its destination
        topic; `source_partitions`: source topic -> its partition count, as the sender gave it;
        `report_refused(topic, partition, offset, error, incarnation)`: a record refused for
        good; `ask_topic(topic, partitions, config=None)`: asks the Preparer about a topic
        (set later when the Preparer needs this room's producer); `schemas_topic`: the
        registry's source topic (sender.schemas) or None."""
        self.r, self.metrics, self.log = settings, metrics, log
        self.new_producer, self.name_of = new_producer, name_of
        self.source_partitions, self.report_refused = source_partitions, report_refused
        self.ask_topic, self.schemas_topic = ask_topic, schemas_topic
        self.producer = new_producer(**{
            # Records come in bursts of datagrams, not in a tight loop: a longer linger than
            # a relay needs fills the batches (the destination broker spent 8-11 µs per 100-byte
            # record at 5 ms, 5-7 at 50 ms, and the writer itself 5.4-7.8 against 4.4-5.9).
            "linger.ms": WRITER_LINGER_MS,
            "message.timeout.ms": 0, "delivery.report.only.error": True,
            "on_delivery": self.delivered,
            "message.max.bytes": settings.max_record_bytes + FRAMING_ALLOWANCE})
        self.events = None  # the producer of events and dead letters, made when needed
        self.event_queue = deque()  # (topic, key, value, headers) for that producer
        self.events_first = False   # missing ranges to acknowledge before writing more
        self.sent: deque = deque(maxlen=MAX_SENT_RUNS)  # Sent, since the last checkpoint
        self.produced = 0   # records the producer accepted
        self.failed = 0     # records the destination refused
        # (records produced up to and including a run's oldest, its source timestamp in ms):
        # its end-to-end latency is observed once the destination has acknowledged as many.
        self.latency_marks: deque = deque(maxlen=MAX_LATENCY_MARKS)  # of LatencyMark
        self.asked: set = set()           # destination topics asked of, not yet answered
        self.dest_partitions: dict = {}   # destination topic -> partition count
        self.next_metadata: dict = {}     # topic -> when its metadata may be asked again
        self.grow_again: dict = {}        # topic -> when its count may be asked again for a
        #                                   partition it lacks
        self.topic_trouble: dict = {}     # destination topic -> its Trouble
        self.backlog: deque = deque()     # Entry: runs not yet all produced, in order
        self.backlog_records = 0          # records in the backlog (and waiting to recover)
        self.queue_full = False           # the producer's queue refused the backlog's head
        self.full_at = 0                  # what the producer held then (len(producer))
        # (topic, partition, incarnation) -> its last Entry added, which the next run of its
        # chain may join (while none of it is produced: Entry.more)
        self.tails: dict = {}
        # destination topic -> its runs waiting for it to be writable (Entry, in order): out of
        # the backlog, so that a turn costs what can be produced (issue 36)
        self.parked: dict = {}
        self.parked_again = 0.0           # when the parked topics are looked at again
        # destination topic -> its partitions not taking records yet (the Preparer's answers:
        # TopicAnswer.unready, then PartitionsReady), and -> (source topic, source partition)
        # -> the runs waiting for theirs (Entry, in order; the destination's -1, records of a
        # partition it lacks, spread by key, wait for every partition of it)
        self.unready: dict = {}
        self.unready_runs: dict = {}

    def add(self, run: Run, extra: tuple = ()) -> None:
        """A run to write, after those of its partition already waiting: joined to the last
        one when it continues its chain and none of that is produced yet (the cost per run:
        columns, the produce loop's setup, a sent entry, a latency mark, once per join; a
        partition's runs come a datagram apart, other partitions' between them). Each source
        partition's runs stay in their order; the order across partitions is not kept (it is
        not a promise: a destination partition takes one source partition's records)."""
        self.backlog_records += len(run)
        key = (run.topic, run.partition, run.incarnation)
        if extra or run.resend:  # (what follows it must not join what came before it)
            self.tails.pop(key, None)
            self.backlog.append(Entry(run, 0, None, extra))
            return
        tail = self.tails.get(key)
        if tail is not None and tail.more is not None and \
                (tail.more[-1] if tail.more else tail.run).last == run.prev and \
                (tail.run.headers is None) == (run.headers is None) and \
                tail.records + len(run) <= MAX_JOINED_RECORDS:
            tail.more.append(run)
            tail.records += len(run)
            return
        self.tails[key] = entry = Entry(run, 0, None, (), [], len(run))
        self.backlog.append(entry)

    @property
    def holds(self) -> bool:
        """Whether runs wait to be produced (in the backlog, parked for their topic, or
        waiting for their partition to take records)."""
        return bool(self.backlog or self.parked or self.unready_runs)

    def waits(self) -> bool:
        """Whether nothing in the backlog can be produced now: it waits for missing ranges to
        be acknowledged, or every run for its destination topic (parked: the loop then waits
        for input rather than spin)."""
        return self.events_first or not self.backlog

    # -- writing -------------------------------------------------------------------------------

    def produce_backlog(self):
        """Produce waiting runs in order. A destination topic not writable yet keeps its runs
        (in their order, parked) without holding up other topics'; one that will never be
        writable sends them to the dead-letter topic; a destination partition not taking
        records yet keeps its source partition's runs (in order, in unready_runs) until the
        Preparer answers it ready (partitions_ready), without holding up other partitions'. A
        run's columns and header lists are built when its first record is offered, once: its
        written-at stamp is that time, as it is for the records waiting in the producer's
        queue.

        It costs what can change: nothing while the producer's queue is full and nothing has
        been acknowledged since (it would refuse the head again), the runs added since the last
        call otherwise, and the parked topics once per PARKED_AGAIN_SECONDS (their answers
        bring them back at once: topic_answered); it walked, joined and copied the whole
        backlog at every turn (issue 36: a third of a core with 10 000 partitions held)."""
        if self.events_first:
            if self.flush_events(FLUSH_STEP_SECONDS):
                return  # (the missing-records topic is slow or down: the next step waits on)
            self.events_first = False
        if self.queue_full and len(self.producer) >= self.full_at > 0 and self.backlog:
            return  # (nothing acknowledged since the queue refused the head)
        now = time.monotonic()
        if self.parked and now >= self.parked_again:
            self._look_at_parked(now)
        stamp = self.r.written_at_header
        now_ms = int(time.time() * 1000)
        written_at = written_at_header(stamp, now_ms)
        backlog, parked = self.backlog, self.parked
        self.queue_full = False
        while backlog:
            entry = backlog[0]
            run = entry.run
            topic = self.name_of(run.topic)
            waiting = self.unready_runs.get(topic)
            if waiting is not None and (run.topic, run.partition) in waiting:
                waiting[(run.topic, run.partition)].append(backlog.popleft())
                continue  # (after its partition's runs waiting already)
            if topic in parked:
                parked[topic].append(backlog.popleft())
                continue
            if topic in self.dest_partitions and run.partition >= self.dest_partitions[topic] \
                    and self.grown(topic, run):
                del self.dest_partitions[topic]  # (asked again: raised to the source's count)
            if topic not in self.dest_partitions and \
                    not self.ensure_topic(topic, self.partitions_of(run.topic)):
                backlog.popleft()
                trouble = self.topic_trouble.get(topic)
                if topic_given_up(trouble, now):
                    self.dead_letter_run(self._whole(entry), entry.done, topic, trouble.error)
                    continue
                parked[topic] = deque([entry])
                continue
            partition = run.partition if run.partition < self.dest_partitions[topic] else -1
            unready = self.unready.get(topic)
            if unready and (partition < 0 or partition in unready):
                self.unready_runs.setdefault(topic, {})[(run.topic, run.partition)] = \
                    deque([backlog.popleft()])
                continue
            if entry.columns is None:  # (once a run: a full queue's retry resumes where it stopped)
                run = self._whole(entry)
                own = run.header_lists()
                entry.columns = Columns(run.key_list(), run.value_list(), own, provenance_headers(
                    run.topic, run.partition, run.incarnation, run.offsets, own,
                    [*written_at, *entry.extra] if entry.extra else written_at))
            columns, start = entry.columns, entry.done
            try:
                done = produce_run(self.producer, topic, partition, run, columns.keys,
                                   columns.values, columns.headers, start)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                    raise
                # (the producer does not know a partition added just now yet: the Preparer
                # refreshes its metadata when it is asked again)
                del self.dest_partitions[topic]
                parked[topic] = deque([backlog.popleft()])
                continue
            if done > start and run.types[start]:  # one sample a run: its oldest record
                self.latency_marks.append(LatencyMark(self.produced + 1, run.timestamps[start]))
            if start == 0 < done:  # (once a run, not at every retry; without its headers)
                self.sent.append(Sent(topic, run, columns.keys, columns.values, columns.own))
            self.produced += done - start
            self.backlog_records -= done - start
            if done < len(run):  # the producer's queue is full: the rest waits, in order
                self.queue_full = True
                self.full_at = len(self.producer)
                entry.done = done
                break
            backlog.popleft()
        self.metrics.set("backlog_records", self.backlog_records)

    def _whole(self, entry: Entry) -> Run:
        """An entry's run, its joins done and closed (Entry.whole), no longer a tail."""
        run = entry.run
        key = (run.topic, run.partition, run.incarnation)
        if self.tails.get(key) is entry:
            del self.tails[key]
        return entry.whole()

    def _look_at_parked(self, now: float) -> None:
        """The parked topics looked at again (PARKED_AGAIN_SECONDS): asked about again when it
        is time (ensure_topic), their runs back in the backlog, ahead of what came after them,
        once the topic is writable, or dead letters once it is given up."""
        self.parked_again = now + PARKED_AGAIN_SECONDS
        for topic, entries in list(self.parked.items()):
            if topic in self.dest_partitions or \
                    self.ensure_topic(topic, self.partitions_of(entries[0].run.topic)):
                self._unpark(topic)
                continue
            trouble = self.topic_trouble.get(topic)
            if topic_given_up(trouble, now):
                del self.parked[topic]
                for entry in entries:
                    self.dead_letter_run(self._whole(entry), entry.done, topic, trouble.error)

    def _unpark(self, topic: str) -> None:
        """A parked topic's runs back at the head of the backlog: they came before any of its
        runs still there (a full queue stopped the walk before it reached them)."""
        entries = self.parked.pop(topic, None)
        if entries:
            self.backlog.extendleft(reversed(entries))
        self._ready_runs(topic)

    def _ready_runs(self, topic: str) -> None:
        """The runs of `topic` waiting for a partition that takes records now back at the head
        of the backlog, or of its parked runs when the topic is parked again (asked again: they
        came before any of their partition's runs there, which were parked after them)."""
        waiting = self.unready_runs.get(topic)
        if not waiting:
            return
        unready = self.unready.get(topic, ())
        count = self.dest_partitions.get(topic)
        going = []
        for key in list(waiting):
            partition = key[1] if count is None or key[1] < count else -1
            if not unready or (partition >= 0 and partition not in unready):
                going += waiting.pop(key)
        if not waiting:
            del self.unready_runs[topic]
        if going:
            (self.parked[topic] if topic in self.parked else self.backlog).extendleft(
                reversed(going))

    def partitions_ready(self, answer: PartitionsReady) -> None:
        """The Preparer's answer that partitions of a destination topic take records now (or
        were waited for long enough): their runs go."""
        unready = self.unready.get(answer.topic)
        if unready is None:
            return
        unready -= answer.partitions
        if not unready:
            del self.unready[answer.topic]
        self._ready_runs(answer.topic)

    def acknowledged(self) -> None:
        """What the destination has acknowledged, given the records the producer still holds:
        the written count, and the end-to-end latency (source timestamp to acknowledgement) of
        each sampled run acknowledged by now. Delivery reports come for errors only, so a run
        counts as acknowledged once the records no longer held by the producer are as many as
        were produced up to its oldest: exact within a partition (librdkafka acknowledges a
        partition's records in order), approximate across partitions."""
        self._acknowledged(len(self.producer))

    def _acknowledged(self, outstanding: int) -> None:
        acknowledged = self.produced - outstanding
        self.metrics.set("records", acknowledged - self.failed)
        marks = self.latency_marks
        if not marks or marks[0].produced > acknowledged:
            return
        now_ms = time.time() * 1000
        while marks and marks[0].produced <= acknowledged:
            self.metrics.observe("end_to_end_latency_seconds",
                                 max(0.0, now_ms - marks.popleft().timestamp_ms) / 1000)

    def flush(self, wait: float) -> tuple:
        """Records and events still not acknowledged after `wait` each (the records' count is
        taken as acknowledged)."""
        left = self.producer.flush(wait)
        left_events = self.flush_events(wait)
        self._acknowledged(left)
        return left, left_events

    def settle(self, wait: float) -> str | None:
        """A step of a checkpoint's flush: None once the destination has acknowledged every
        record and event produced (the sent runs are then forgotten); "stuck" when what is left
        is not in flight (events waiting for their topic: no flush waits for them); "waiting"
        otherwise."""
        if self.producer.flush(wait) or self.flush_events(wait):
            stuck = not len(self.producer) and (self.events is None or not len(self.events))
            return "stuck" if stuck else "waiting"
        self.sent.clear()
        return None

    def poll(self, wait: float = 0) -> None:
        self.producer.poll(wait)
        if self.events is not None and not wait:
            self.events.poll(0)

    # -- dead letters and refusals -----------------------------------------------------------

    def dead_letter_run(self, run: Run, start: int, topic: str, error: str) -> None:
        """A run whose destination topic cannot be created: to the dead-letter topic."""
        self.backlog_records -= len(run) - start
        keys, values, own = run.key_list(), run.value_list(), run.header_lists()
        for i in range(start, len(run)):
            self.dead_letter(topic, keys[i], values[i], _headers(run, i, own), error)

    def dead_letter(self, topic: str, key, value, headers: list, error: str) -> None:
        """A record the destination will never take: to receiver.dead.letter.topic with why,
        or reported missing ("refused") when there is none."""
        self.metrics.inc("dead_letters")
        if not self.r.dead_letter_topic:
            self.refused(headers, topic, error)
            return
        self.event_queue.append((self.r.dead_letter_topic, key, value,
                                 dead_letter_headers(headers, topic, error)))

    def refused(self, headers: list, where: str, error: str) -> None:
        """A record refused by the destination and by the dead-letter topic: reported."""
        p = Provenance.parse(headers)
        if p is None:
            self.log.error("a record refused by %s carries no source coordinates: %s",
                           where, error)
            return
        self.report_refused(p.topic, p.partition, p.offset, error, p.incarnation)

    def delivered(self, err, msg):
        """Called for records the destination refused (delivery.report.only.error): with
        message.timeout.ms 0, only for good."""
        self.failed += 1
        self.metrics.inc("errors", reason="produce")
        headers = self.headers_of(msg)
        p = Provenance.parse(headers)
        self.log.error("a record (%s) was not written to %s[%s]: %s; sending it to the "
                       "dead-letter topic", f"source {p.topic}[{p.partition}]@{p.offset}"
                       if p is not None else "source unknown", msg.topic(), msg.partition(),
                       err.str())
        self.dead_letter(msg.topic(), msg.key(), msg.value(), headers, err.str())

    def headers_of(self, msg) -> list:
        """A refused record's headers, provenance included: delivery reports carry none, so
        the record is looked up among the runs produced since the last acknowledgement."""
        key, value = msg.key(), msg.value()
        for sent in reversed(self.sent):
            if sent.topic != msg.topic():
                continue
            for i, (k, v) in enumerate(zip(sent.keys, sent.values)):
                if v == value and k == key:
                    return _headers(sent.run, i, sent.own)
        return list(msg.headers() or [])

    # -- destination topics ------------------------------------------------------------------

    def partitions_of(self, source_topic: str) -> int:
        """The partition count the sender gave for a source topic (a new destination's)."""
        return max(1, min(int(self.source_partitions.get(source_topic, 1)), MAX_PARTITIONS))

    def producer_knows(self, topic: str) -> None:
        """From the Preparer's thread: the producer's metadata of `topic` refreshed (it holds
        a count for minutes, and refuses records of partitions added since)."""
        self.producer.list_topics(topic=topic, timeout=METADATA_TIMEOUT)

    def grown(self, topic: str, run: Run) -> bool:
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

    def ensure_topic(self, topic: str, partitions: int) -> bool:
        """Whether a destination topic's partition count is known. False until then: the
        Preparer is asked (at most once per METADATA_AGAIN_SECONDS per topic) to learn it,
        creating the topic with `partitions` if it does not exist; `topic_answered` keeps
        the trouble in topic_trouble."""
        if topic in self.dest_partitions:
            return True
        now = time.monotonic()
        if topic in self.asked or now < self.next_metadata.get(topic, 0.0):
            return False
        if self.schemas_topic and topic == self.r.schemas_topic:
            # as a registry requires of its topic, whatever the source's (a registry refuses
            # more than one partition, and a topic not compacted)
            self.ask_topic(topic, 1, SCHEMAS_TOPIC_CONFIG)
        else:
            self.ask_topic(topic, partitions)
        self.asked.add(topic)
        return False

    def topic_answered(self, answer: TopicAnswer) -> None:
        topic = answer.topic
        self.asked.discard(topic)
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
            if answer.unready:  # (PartitionsReady follow)
                self.unready[topic] = set(answer.unready)
            else:
                self.unready.pop(topic, None)
            self.topic_trouble.pop(topic, None)
            self._unpark(topic)
            return
        error = answer.error
        for_good = error.code() in REFUSED_FOR_GOOD  # (for the warning)
        if topic not in self.topic_trouble:
            self.log.warning("cannot read or create destination topic %s: %s; %s", topic,
                             error.str(), "its records go to the dead-letter topic"
                             if for_good else "retrying, other topics go on")
        self.topic_trouble[topic] = topic_trouble(self.topic_trouble.get(topic), now, error)
        self.metrics.inc("errors", reason="metadata")

    # -- events --------------------------------------------------------------------------------

    def emit(self, topic: str, key: bytes, value: bytes, headers) -> None:
        """An event for the events producer (headers: None, or a dead letter's)."""
        self.event_queue.append((topic, key, value, headers))

    def produce_events(self) -> None:
        """Hand queued events to their producer, in order, as far as it takes them now."""
        queue = self.event_queue
        if not queue:
            return
        if self.events is None:
            self.events = self.new_producer(**{
                "message.timeout.ms": 0, "on_delivery": self._event_delivered,
                "message.max.bytes": self.r.max_record_bytes + FRAMING_ALLOWANCE})
        while queue:
            topic, key, value, headers = queue[0]
            if topic not in self.dest_partitions and not self.ensure_topic(topic, 1):
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

    def flush_events(self, wait: float) -> int:
        """Events still not acknowledged after `wait` (queued ones included)."""
        self.produce_events()
        left = self.events.flush(wait) if self.events is not None else 0
        self.produce_events()  # (dead letters of records refused during the flush)
        if self.event_queue and self.events is not None:
            left += self.events.flush(wait)
        return left + len(self.event_queue)

    def _dead_letter_delivered(self, err, msg, headers):
        if err is not None:
            self.refused(headers, msg.topic(), f"{err.str()}, and then by the dead-letter "
                         f"topic")

    def _event_delivered(self, err, msg):
        if err is None:
            return
        self.metrics.inc("errors", reason="event")
        self.log.error("could not write to %s: %s", msg.topic(), err.str())

    def close(self) -> None:
        self.producer.flush(1)
        if self.events is not None:
            self.events.flush(1)


class Trouble(NamedTuple):
    """Why a destination topic cannot be written yet, and since when (time.monotonic())."""
    since: float
    error: str        # the cluster's error, as its text
    for_good: bool    # an error no wait mends (REFUSED_FOR_GOOD)


class LatencyMark(NamedTuple):
    """A run's oldest record, sampled for the end-to-end latency: observed once the destination
    has acknowledged `produced` records."""
    produced: int      # records produced up to and including it
    timestamp_ms: int  # its source timestamp


def topic_trouble(before, now: float, error) -> Trouble:
    """A destination topic's Trouble after `error`, given the trouble before (None). A topic is
    given up (dead letters) once it was refused for good, or TOPIC_GIVE_UP_SECONDS after `since`;
    an unreachable cluster says nothing of the topic, so the clock starts again from each such
    error: an outage is waited out, however long."""
    code = error.code()
    if before is not None and code not in CLUSTER_UNAVAILABLE and code not in REFUSED_FOR_GOOD:
        return before
    return Trouble(now, error.str(), code in REFUSED_FOR_GOOD)


def topic_given_up(trouble, now: float) -> bool:
    """Whether a destination topic with `trouble` (topic_trouble's, or None) is given up at
    `now`: its records go to the dead-letter topic."""
    return trouble is not None and (trouble.for_good or
                                    now - trouble.since >= TOPIC_GIVE_UP_SECONDS)


def _headers(run: Run, i: int, own) -> list:
    """Record i's headers as written: its own, then the provenance (the dead-letter paths; the
    hot path builds the same lists for a whole run)."""
    return provenance_headers(run.topic, run.partition, run.incarnation, run.offsets[i:i + 1],
                              None if own is None else own[i:i + 1])[0]
