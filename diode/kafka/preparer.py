"""What a kafka_writer asks of its destination cluster before writing to it, asked off its loop.

Before the first record of a destination topic is produced, the writer must know the topic's
partition count (and create the topic when it does not exist); before the first record or claim
of a source topic's partition is offered, what the destination already holds of it
(diode.kafka.recovery). Both wait on the cluster: seconds when it is slow, up to a create's
timeout (20 s) when it does not answer. A writer asking in its own loop stops for that long, and
so do its heartbeats: the supervisor kills a worker silent for
supervisor.heartbeat.timeout.seconds, and a slow cluster turns into restarts.

A Preparer asks from a thread of its own, with clients of its own (a confluent_kafka client is
not shared with the loop's), in the order the questions were asked, and hands each answer to the
loop through a small queue: the loop never waits on the cluster. The topics asked about while it
was busy are answered together (up to TOPICS_PER_LOOK): their metadata in one request (for those
topics, never the whole cluster's), the missing ones created in one CreateTopics request, so a
writer whose first records name 2 000 topics waits for a few requests, not for 2 000 of each. A
topic the cluster refuses is answered with its error; the others of its batch are not held up.
A topic's partitions are written to only once their leaders take records: Apache Kafka names a
new partition's leader in its metadata before the leader has made the partition's log (seconds
to minutes for 1 000 partitions of a loaded broker), and a producer's records sent meanwhile are
refused ("Not leader for partition") and retried, each refusal holding one of the 5 requests an
idempotent producer keeps in flight to the broker, so the partitions that were ready waited
behind those that were not (issue 36: 1 000 partitions created by the writer copied at 0.28 of
the relay, 0.60 created ahead). A topic created, or first asked about, is answered as soon as
its metadata shows it, with the partitions not yet taking records (TopicAnswer.unready); those
settle: looked at together every SETTLE_POLL, one metadata request for the topics not shown yet
and ListOffsets of all the partitions settling (OFFSETS_PER_REQUEST a request), while the
questions asked meanwhile are answered; the partitions that answer are answered ready
(PartitionsReady) at once, and those still unanswered READY_SECONDS after the topic was asked
about all the same (the producer then retries as it would have). The writer holds the records of
an unready partition until then, and writes the others' at once (the topic waited for its
slowest partition before: startup 8.3 s at 1 000 partitions).
The loop asks again only once it has the answer, so the questions outstanding are at most one
per topic. What the destination holds of the source topics a restarted writer met in a turn is
asked in one question and read together (diode.kafka.recovery.holdings: one consumer, one wait
for the true end, HOLDINGS_PER_READ partitions at most), answered per source topic: a
destination topic the cluster refuses is answered with its error, the others are not held up.
"""

import logging
import queue
import threading
import time
from concurrent.futures import wait
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from diode.errors import DiodeError
from diode.kafka import recovery
from diode.kafka.clients import admin_config, create_topics, raise_partitions
from diode.kafka.refresh import hand, taken

log = logging.getLogger("diode.kafka.preparer")

METADATA_TIMEOUT = 5.0   # s: one topic's metadata
CREATE_TIMEOUT = 15.0    # s: a topic's creation (the cluster's operation timeout)
SETTLE_SECONDS = 5.0     # s: a topic just created may show an error in metadata this long
READY_SECONDS = 15.0     # s: a topic's partitions are waited for this long at most to take
#                          records (ListOffsets answered), then answered ready all the same
SETTLE_POLL = 0.2        # s: the topics waiting for either are looked at this often
RECOVERY_TIMEOUT = 5.0   # s: reading what the destination holds (diode.kafka.recovery)
ANSWERS = 64             # answers waiting for the loop; past it the thread waits
TOPICS_PER_LOOK = 1000   # topics asked about together (one metadata request, one create)
OFFSETS_PER_REQUEST = 1000  # partitions in one ListOffsets at most (one of 10 000 crashed
#                            a process inside librdkafka: scripts/benchlib/meter.py)
HOLDINGS_PER_READ = 1000  # source partitions whose holdings are read together (one consumer):
#                           Tansu left most of 5 000 assigned at once unanswered for 30 s


class TopicAnswer(NamedTuple):
    topic: str                 # a destination topic
    partitions: int            # its partition count; 0 when not known (error says why)
    created: bool              # created by this question
    error: KafkaError | None   # why it could not be described or created
    unready: frozenset = frozenset()  # its partitions not taking records yet: each answered
    #                                   by a PartitionsReady once it does


class PartitionsReady(NamedTuple):
    """Partitions of a destination topic answered with some unready (TopicAnswer.unready) that
    take records now (their leader answered ListOffsets), or were waited for READY_SECONDS."""
    topic: str
    partitions: frozenset


class Settling(NamedTuple):
    """A topic whose partitions are waited for: its metadata (count 0: just created), then
    each partition's leader taking records."""
    since: float               # when it started waiting (time.monotonic())
    count: int                 # its partition count; 0 until its metadata shows it
    created: bool              # created by its question
    error: KafkaError | None   # the last error its metadata gave
    waiting: tuple = ()        # its partitions not yet seen taking records (ListOffsets)
    answered: bool = False     # its TopicAnswer given (with `waiting` unready)


class HoldingsAnswer(NamedTuple):
    topic: str              # a source topic
    wanted: frozenset       # the (topic, partition, incarnation) asked about
    written: dict           # of those, the highest source offset the destination holds
    reported: dict | None   # the missing ranges already reported (None: not asked)
    error: str | None       # why the destination could not be read (the rest empty)


class Preparer:
    """`settings`: the destination's librdkafka settings (receiver.kafka)."""

    def __init__(self, settings: dict, configs=lambda topic: {}, grown=lambda topic: None):
        self.settings = settings
        self.configs = configs  # destination topic -> the configs to create it with
        self.grown = grown      # called with a topic asked about again, once answered
        self._counts: dict = {}  # topic -> the count last answered
        self._settling: dict = {}  # topic -> Settling: asked, its answer waiting (the thread's)
        self.questions: queue.Queue = queue.Queue()  # (at most one per topic: see the module)
        self.answers: queue.Queue = queue.Queue(maxsize=ANSWERS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="destination-preparer",
                                        daemon=True)

    def start(self) -> "Preparer":
        self._thread.start()
        return self

    def topic(self, topic: str, partitions: int, config: dict | None = None) -> None:
        """Ask for `topic`'s partition count, creating it with `partitions` (and the topic
        configs `config`, with those pinned for it) if it does not exist, raising its count to
        `partitions` if it has fewer (the source's was raised); answered by a TopicAnswer."""
        self.questions.put(("topic", topic, partitions, config))

    def holdings(self, asked: dict, missing_topic: str | None, since_ms: int | None) -> None:
        """Ask what the destination holds of the source topics in `asked` (source topic ->
        (destination topic, the (source topic, partition, incarnation) wanted)) and, with
        `missing_topic`, the missing ranges reported there since `since_ms`; answered by a
        HoldingsAnswer per source topic, read together (up to HOLDINGS_PER_READ partitions a
        read, diode.kafka.recovery.holdings)."""
        self.questions.put(("holdings", {topic: (destination, frozenset(wanted))
                                         for topic, (destination, wanted) in asked.items()},
                            missing_topic, since_ms))

    def take(self) -> list:
        """The answers given since the last call, oldest first (never waits)."""
        return taken(self.answers)

    def close(self, timeout: float = 1.0) -> None:
        """Ask the thread to stop; a question it is waiting on is not waited for."""
        self._stop.set()
        self.questions.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        # never creates a topic by asking for its metadata (a cluster with
        # auto.create.topics.enable would make it with its default partition count)
        admin = AdminClient({**admin_config(self.settings), "allow.auto.create.topics": False})
        while not self._stop.is_set():
            try:  # (while topics settle, they are looked at again every SETTLE_POLL)
                questions = [self.questions.get(timeout=SETTLE_POLL if self._settling
                                                else None)]
            except queue.Empty:
                questions = []
            while questions and questions[-1] is not None and \
                    len(questions) < TOPICS_PER_LOOK:
                try:  # (what was asked meanwhile, answered together)
                    questions.append(self.questions.get_nowait())
                except queue.Empty:
                    break
            topics = [q[1:] for q in questions if q is not None and q[0] == "topic"]
            for answer in self._topic_answers(admin, topics):
                hand(self.answers, answer, self._stop)
            holdings = [q[1:] for q in questions if q is not None and q[0] == "holdings"]
            if holdings:  # (the questions asked meanwhile, read together)
                asked = {topic: wanted for q in holdings for topic, wanted in q[0].items()}
                missing_topic, since_ms = next(
                    ((m, since) for _, m, since in holdings if m), (None, None))
                for answer in self._holdings_answers(asked, missing_topic, since_ms):
                    hand(self.answers, answer, self._stop)
            if questions and questions[-1] is None:
                return

    def _topic_answers(self, admin, questions: list) -> list:
        """The TopicAnswers to `questions` ((topic, partitions, config) each) that can be
        given now, and to the topics settling shown in metadata (or given up), and the
        PartitionsReady of the partitions settling that take records now (or were waited for
        READY_SECONDS); their counts remembered. A failure (a bug) answered all the same: the
        loop must not wait (the partitions settling answered ready, as after READY_SECONDS)."""
        try:
            answers = self._prepare_topics(admin, questions) if questions else []
            answers += self._settle(admin)
        except Exception as exc:
            settling, self._settling = self._settling, {}
            asked = dict.fromkeys(q[0] for q in questions)
            log.exception("asking the destination about %s failed",
                          ", ".join(dict.fromkeys([*asked, *settling])))
            error = KafkaError(KafkaError._FAIL, repr(exc))
            asked.update((t, None) for t, s in settling.items() if not s.answered)
            return [*(PartitionsReady(t, frozenset(s.waiting)) for t, s in settling.items()
                      if s.answered), *(TopicAnswer(topic, 0, False, error) for topic in asked)]
        for answer in answers:
            if type(answer) is TopicAnswer and answer.partitions:
                if answer.topic in self._counts:  # (asked again: its count may be new)
                    self.grown(answer.topic)
                self._counts[answer.topic] = answer.partitions
        return answers

    def _holdings_answers(self, asked: dict, missing_topic, since_ms):
        """A HoldingsAnswer to each source topic of `asked`, read HOLDINGS_PER_READ
        (source topic, partition, incarnation) at most at a time, each read's answers handed
        as soon as it is done; a failure (a bug) answered all the same: the loop must not
        wait."""
        read, size = {}, 0
        for topic, (destination, wanted) in asked.items():
            if read and size + len(wanted) > HOLDINGS_PER_READ:
                yield from self._holdings_read(read, missing_topic, since_ms)
                missing_topic, read, size = None, {}, 0  # (read once: with the first)
                if self._stop.is_set():
                    return
            read[topic] = (destination, wanted)
            size += len(wanted)
        if read:
            yield from self._holdings_read(read, missing_topic, since_ms)

    def _holdings_read(self, asked: dict, missing_topic, since_ms) -> list:
        by_destination: dict = {}
        for destination, wanted in asked.values():
            by_destination.setdefault(destination, set()).update(wanted)
        try:
            got = recovery.holdings(self.settings, by_destination, missing_topic, since_ms,
                                    timeout=RECOVERY_TIMEOUT)
        except DiodeError as exc:
            return [HoldingsAnswer(topic, wanted, {}, None, str(exc))
                    for topic, (_, wanted) in asked.items()]
        except Exception as exc:  # (a bug: answered all the same, the loop must not wait)
            log.exception("asking the destination about %s failed", ", ".join(asked))
            return [HoldingsAnswer(topic, wanted, {}, None, repr(exc))
                    for topic, (_, wanted) in asked.items()]
        answers = []
        for topic, (destination, wanted) in asked.items():
            if destination in got.failed:
                answers.append(HoldingsAnswer(
                    topic, wanted, {}, None, f"destination cluster: topic {destination}: "
                    f"{got.failed[destination]}"))
            else:
                answers.append(HoldingsAnswer(
                    topic, wanted, {tp: o for tp, o in got.written.items() if tp in wanted},
                    got.reported, None))
        return answers

    def _prepare_topics(self, admin, questions: list) -> list:
        """The TopicAnswers to questions (topic, partitions, config) that can be given now:
        their counts from one metadata request; those with fewer partitions than asked raised;
        those the cluster refuses or does not answer for told so, each with its partitions
        still settling (unready). Those missing are created together and settle (`_settle`),
        as does a topic asked about for the first time, and the partitions a raise adds."""
        wanted = {topic: (partitions, config) for topic, partitions, config in questions}
        answers: list = []
        try:
            counts = described(admin, list(wanted))
        except KafkaException as exc:  # (the cluster does not answer: every one told so)
            counts = {topic: (0, exc.args[0]) for topic in wanted}
        missing = {}
        now = time.monotonic()
        for topic, (partitions, config) in wanted.items():
            count, error = counts[topic]
            if count >= partitions and topic not in self._counts:
                self._settling[topic] = Settling(now, count, False, None,
                                                 tuple(range(count)))
            elif count >= partitions:
                answers.append(TopicAnswer(topic, count, False, None, self._unready(topic)))
            elif count:
                grown = self._grow(admin, topic, count, partitions)
                if grown > count:  # (the partitions added settle as a new topic's do)
                    s = self._settling.get(topic) or Settling(now, grown, False, None, (), True)
                    self._settling[topic] = s._replace(
                        since=now, count=grown, waiting=(*s.waiting, *range(count, grown)))
                answers.append(TopicAnswer(topic, grown, False, None, self._unready(topic)))
            elif error is not None and error.code() < 0:  # (librdkafka's own: no answer)
                answers.append(TopicAnswer(topic, 0, False, error))
            else:
                missing[topic] = (partitions, {**self.configs(topic), **(config or {})})
        made = create_topics(admin, missing, CREATE_TIMEOUT) if missing else {}
        now = time.monotonic()
        for topic, created in made.items():
            if isinstance(created, KafkaError):
                answers.append(TopicAnswer(topic, 0, False, created))
            else:  # (created, or by someone else meanwhile: not in metadata yet, maybe)
                self._settling[topic] = Settling(now, 0, created, None)
        return answers

    def _unready(self, topic: str) -> frozenset:
        """The partitions of `topic` settling, answered unready (a PartitionsReady follows)."""
        s = self._settling.get(topic)
        return frozenset(s.waiting) if s is not None and s.answered else frozenset()

    def _settle(self, admin) -> list:
        """The answers of the topics settling: a TopicAnswer once in metadata (else with its
        error after SETTLE_SECONDS), with the partitions not answering ListOffsets yet
        unready; then a PartitionsReady of those answering since (their leader has made its
        log: they take records), and of those left READY_SECONDS after the topic was asked
        about all the same. One metadata request and ListOffsets (OFFSETS_PER_REQUEST a
        request) for all of them (of the partitions not seen taking records yet)."""
        settling, answers = self._settling, []
        if not settling:
            return answers
        unknown = sorted(t for t, s in settling.items() if not s.count)
        if unknown:
            try:
                counts = described(admin, unknown)
            except KafkaException as exc:
                counts = {topic: (0, exc.args[0]) for topic in unknown}
            now = time.monotonic()
            for topic in unknown:
                count, error = counts[topic]
                s = settling[topic]
                if count:
                    settling[topic] = s._replace(count=count, waiting=tuple(range(count)))
                elif now - s.since >= SETTLE_SECONDS or self._stop.is_set():
                    del settling[topic]
                    answers.append(TopicAnswer(topic, 0, False, unshown(topic, error or s.error)))
                else:
                    settling[topic] = s._replace(error=error)
        known = {t: s.waiting for t, s in settling.items() if s.count}
        if not known:
            return answers
        waiting = unhosted(admin, known)
        now = time.monotonic()
        for topic, before in known.items():
            s = settling[topic]
            left = tuple(sorted(waiting[topic][0])) if topic in waiting else ()
            if left and (now - s.since >= READY_SECONDS or self._stop.is_set()):
                log.warning("destination topic %s: partition(s) %s not taking records after "
                            "%.0f s (%s); writing to it all the same", topic,
                            ", ".join(map(str, left)), READY_SECONDS, waiting[topic][1])
                left = ()
            if not s.answered:
                answers.append(TopicAnswer(topic, s.count, s.created, None, frozenset(left)))
            elif len(left) < len(before):
                answers.append(PartitionsReady(topic, frozenset(before) - frozenset(left)))
            if left:
                settling[topic] = s._replace(waiting=left, answered=True)
            else:
                del settling[topic]
        return answers

    def _grow(self, admin, topic: str, count: int, partitions: int) -> int:
        """Raise `topic`'s partition count from `count` to `partitions`; the count it has
        after (the same when the destination refuses: logged, the records of the partitions
        it lacks are then spread by key)."""
        try:
            raise_partitions(admin, topic, partitions, CREATE_TIMEOUT)
            log.info("raised destination topic %s from %d to %d partitions (the source's)",
                     topic, count, partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:  # (raised meanwhile)
                log.warning("cannot raise destination topic %s from %d to %d partitions (%s): "
                            "records of the partitions it lacks are spread by key", topic,
                            count, partitions, exc.args[0].str())
        return describe(admin, topic)[0] or count


def described(admin, topics: list) -> dict:
    """topic -> (its partition count, None), or (0, the error the cluster gives for it) when it
    has none (it does not exist, or not yet everywhere): all of `topics` in one metadata
    request. KafkaException when the cluster does not answer."""
    out = {}
    futures = admin.describe_topics(TopicCollection(topics), request_timeout=METADATA_TIMEOUT)
    for topic, future in futures.items():
        try:
            out[topic] = (len(future.result(METADATA_TIMEOUT + 5).partitions), None)
        except KafkaException as exc:
            out[topic] = (0, exc.args[0])
        except TimeoutError:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "describing topics: "
                                            "no answer")) from None
    return out


def unshown(topic: str, error: KafkaError | None) -> KafkaError:
    """Why a topic the cluster created (or said it had already) is not answered: the error its
    metadata gives, unless that only says it does not know the topic, which a loaded Apache
    Kafka broker says for seconds to minutes after a creation (its metadata published late):
    then LEADER_NOT_AVAILABLE, which a writer waits out like an outage, never gives up (its
    records went to the dead-letter topic once the topic had been unknown for
    TOPIC_GIVE_UP_SECONDS: 6 250 of 50 000 records over 1 000 partitions of a loaded bench)."""
    if error is not None and error.code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                  KafkaError._UNKNOWN_TOPIC):
        return error
    return KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"{topic} was created, and is not in "
                      f"the destination's metadata {SETTLE_SECONDS:.0f} s later")


def unhosted(admin, partitions: dict) -> dict:
    """topic -> ([those of its `partitions` whose leader does not answer ListOffsets], why),
    of `partitions` ({topic: partition numbers}): a partition answered has its log made by its
    leader, and takes records. Asked in requests of OFFSETS_PER_REQUEST partitions, sent together and
    then waited for; a request the cluster does not take counts its partitions unanswered."""
    pairs = [TopicPartition(topic, p) for topic, numbers in partitions.items()
             for p in numbers]
    futures: dict = {}
    out: dict = {}
    for i in range(0, len(pairs), OFFSETS_PER_REQUEST):
        batch = pairs[i:i + OFFSETS_PER_REQUEST]
        try:
            futures.update(admin.list_offsets({tp: OffsetSpec.latest() for tp in batch},
                                              request_timeout=METADATA_TIMEOUT))
        except KafkaException as exc:
            for tp in batch:
                out.setdefault(tp.topic, ([], exc.args[0].str()))[0].append(tp.partition)
    wait(futures.values(), timeout=METADATA_TIMEOUT + 5)
    for tp, future in futures.items():
        why = "no answer"
        if future.done():
            try:
                future.result(0)
                continue
            except KafkaException as exc:
                why = exc.args[0].str()
        out.setdefault(tp.topic, ([], why))[0].append(tp.partition)
    return out


def describe(admin, topic: str) -> tuple[int, KafkaError | None]:
    """(`topic`'s partition count, None), or (0, the error its metadata gives) when it has none
    (it does not exist, or not yet everywhere); KafkaException when the cluster does not
    answer."""
    md = admin.list_topics(topic=topic, timeout=METADATA_TIMEOUT).topics.get(topic)
    if md is None:
        return 0, None
    if md.error is not None:
        return 0, md.error
    return len(md.partitions), None
