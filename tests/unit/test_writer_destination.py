"""The writer's destination room (diode.writer.destination) against a producer that holds what
it is handed: records written in order with their provenance, a full queue waited out without
loss, a topic given up sending its records to the dead-letter topic (or reporting them refused),
a refused record named from the runs produced, and a checkpoint's flush told when it is done."""

from concurrent.futures import Future
from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException

from diode.kafka import preparer
from diode.kafka.preparer import PartitionsReady, Preparer, TopicAnswer
from diode.writer import destination as destination_module
from diode.writer.destination import CLUSTER_UNAVAILABLE, TOPIC_GIVE_UP_SECONDS, Destination
from tests.unit.writer_fakes import LOG, Message, FakeProducer, metrics, run, settings


def destination(room: int = 10**9, **receiver):
    refused, asked, producers = [], [], []

    def new_producer(**config):
        producers.append(FakeProducer(room, **config))
        return producers[-1]

    d = Destination(settings(**receiver), metrics(), LOG, new_producer, lambda t: "dst_" + t,
                    {"t": 4}, lambda *a: refused.append(a),
                    ask_topic=lambda *a: asked.append(a))
    return d, refused, asked, producers


def written(producer) -> list:
    return [(m.topic(), m.partition(), m.key(), dict(m.headers())["sourceOffset"])
            for m in producer.taken]


def test_runs_are_written_in_order_to_their_partition_with_their_provenance():
    d, _, asked, _ = destination()
    d.add(run(0, 3, partition=2))
    d.add(run(3, 2, partition=2))
    d.produce_backlog()  # the destination topic is not known yet: asked, nothing lost
    assert asked == [("dst_t", 4)] and d.backlog_records == 5 and not d.producer.taken
    d.topic_answered(TopicAnswer("dst_t", 4, False, None))
    d.produce_backlog()
    assert written(d.producer) == [("dst_t", 2, b"k%d" % o, b"%d" % o) for o in range(5)]
    assert d.backlog_records == 0 and not d.backlog
    d.acknowledged()
    assert d.metrics.get("records") == 0  # held by the producer: not written yet
    d.producer.acknowledge()
    d.acknowledged()
    assert d.metrics.get("records") == 5


def test_a_full_queue_holds_the_rest_in_order_and_resumes_where_it_stopped():
    d, _, _, _ = destination(room=3)
    d.dest_partitions["dst_t"] = 4
    d.add(run(0, 5))
    d.add(run(10, 2, prev=4))  # (a gap before it: not joined to the first)
    d.produce_backlog()
    assert d.queue_full and d.produced == 3 and d.backlog_records == 4
    d.producer.acknowledge()
    d.produce_backlog()
    d.producer.acknowledge()
    d.produce_backlog()
    assert [w[2] for w in written(d.producer)] == [b"k%d" % o for o in (0, 1, 2, 3, 4, 10, 11)]
    assert not d.backlog and d.backlog_records == 0 and d.produced == 7


def test_a_topic_refused_for_good_sends_its_records_to_the_dead_letter_topic():
    d, _, _, producers = destination()
    d.add(run(0, 2))
    d.produce_backlog()
    d.topic_answered(TopicAnswer("dst_t", 0, False,
                                 KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")))
    d.dest_partitions["diode-dead-letter"] = 1
    d.produce_backlog()
    d.produce_events()
    letters = producers[1].taken
    assert [m.key() for m in letters] == [b"k0", b"k1"] and not d.producer.taken
    headers = dict(letters[0].headers())
    assert headers["diode.destination.topic"] == b"dst_t" and b"denied" in headers["diode.error"]
    assert headers["sourceOffset"] == b"0" and d.metrics.get("dead_letters") == 2


def test_without_a_dead_letter_topic_a_refused_record_is_reported_with_its_coordinates():
    d, refused, _, _ = destination(**{"dead.letter.topic": ""})
    d.dest_partitions["dst_t"] = 4
    d.add(run(7, 3, partition=1))
    d.produce_backlog()
    # the destination refuses offset 8 (a delivery report carries no headers)
    d.delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"),
                Message("dst_t", b"v8", b"k8", 1))
    [(topic, partition, offset, error, _)] = refused
    assert (topic, partition, offset, error) == ("t", 1, 8, "too large")
    assert d.failed == 1


def test_a_checkpoint_waits_until_everything_is_acknowledged():
    d, _, _, _ = destination()
    d.producer.answers = False
    d.dest_partitions["dst_t"] = 4
    d.add(run(0, 2))
    d.produce_backlog()
    assert d.settle(0) == "waiting" and len(d.sent) == 1
    d.producer.answers = True
    assert d.settle(0) is None and not d.sent  # (refusals come before it: nothing to name)


class Counting:
    """Every source topic the destination asked the name of: one per run looked at."""

    def __init__(self):
        self.asked = 0

    def __call__(self, topic: str) -> str:
        self.asked += 1
        return "dst_" + topic


class Attempts(FakeProducer):
    """A FakeProducer that counts every produce call, refused ones too."""

    def __init__(self, room, **config):
        super().__init__(room, **config)
        self.attempts = 0

    def produce(self, *args, **kwargs):
        self.attempts += 1
        super().produce(*args, **kwargs)


def test_a_full_queue_is_not_tried_again_until_something_is_acknowledged():
    """With the producer's queue full the backlog waits whole: another turn looks at none of
    it (it walked, joined and tried every run at every turn), and once the destination has
    acknowledged, it resumes where it stopped: every record once, in order."""
    d, _, _, _ = destination()
    d.producer = Attempts(5)
    d.name_of = names = Counting()
    d.dest_partitions["dst_t"] = 4
    for p in range(4):  # (runs of 1 over the partitions, as records spread thin come)
        for o in range(10):
            d.add(run(o, 1, partition=p, prev=o - 1 if o else None))
    d.add(run(100, 1, partition=0))  # (after a gap: a run of its own)
    d.produce_backlog()
    assert d.queue_full and d.produced == 5 and d.backlog_records == 36
    names.asked = d.producer.attempts = 0
    for _ in range(10):
        d.produce_backlog()
    assert names.asked == 0 and d.producer.attempts == 0
    d.add(run(10, 1, partition=3, prev=9))  # (joined to what waits: looked at once it goes)
    d.produce_backlog()
    assert names.asked == 0 and d.producer.attempts == 0
    while d.backlog:
        d.producer.acknowledge()
        d.produce_backlog()
    sent = [(m.partition(), int(dict(m.headers())["sourceOffset"])) for m in d.producer.taken]
    assert sorted(sent) == sorted({(p, o) for p in range(4) for o in range(10)} |
                                  {(0, 100), (3, 10)})
    for p in range(4):
        assert [o for q, o in sent if q == p] == sorted(o for q, o in sent if q == p)
    assert d.backlog_records == 0 and d.produced == 42


def test_runs_of_a_topic_not_writable_yet_wait_apart_and_cost_nothing_until_it_is():
    """The runs of a destination topic not known yet are parked by topic: the other topics'
    go on, a turn looks only at the runs added since the last (not at every run waiting), and
    the parked ones go, before those that came after them, once the topic is answered."""
    d, _, asked, _ = destination()
    d.name_of = names = Counting()
    d.dest_partitions["dst_u"] = 4
    for o in range(50):
        d.add(run(o, 1, partition=o % 4, prev=o - 1 if o >= 4 else None))  # (t: not known)
    d.produce_backlog()
    assert asked == [("dst_t", 4)] and d.holds and not d.backlog and d.backlog_records == 50
    names.asked = 0
    d.add(run(0, 3, topic="u"))
    d.produce_backlog()
    assert names.asked == 1 and [m.topic() for m in d.producer.taken] == ["dst_u"] * 3
    for _ in range(10):
        d.produce_backlog()
    assert names.asked == 1
    d.add(run(50, 1, partition=2, prev=46))  # (t again: to the parked ones, in order)
    d.topic_answered(TopicAnswer("dst_t", 4, False, None))
    d.produce_backlog()
    written_t = [(m.partition(), int(dict(m.headers())["sourceOffset"]))
                 for m in d.producer.taken if m.topic() == "dst_t"]
    assert sorted(written_t) == sorted([(o % 4, o) for o in range(50)] + [(2, 50)])
    for p in range(4):
        offsets = [o for q, o in written_t if q == p]
        assert offsets == sorted(offsets)
    assert not d.holds and d.backlog_records == 0


def test_runs_of_a_partition_not_taking_records_yet_wait_for_it_and_the_others_go_at_once():
    """A destination topic answered with partitions whose leaders do not take records yet
    (Apache Kafka names a new partition's leader before it has made its log, and refuses
    records meanwhile): the runs of its other partitions are produced at once, those of each
    unready partition wait, in order, counted, holding a checkpoint back, until the Preparer
    answers that partition ready; then they go, each once, in their order."""
    d, _, asked, _ = destination()
    for o in range(40):  # (t[o % 4]: 10 records a partition, a run each)
        d.add(run(o, 1, partition=o % 4, prev=o - 4 if o >= 4 else None))
    d.produce_backlog()
    assert asked == [("dst_t", 4)]
    d.topic_answered(TopicAnswer("dst_t", 4, True, None, frozenset({1, 3})))
    d.produce_backlog()

    def offsets(partition):
        return [int(dict(m.headers())["sourceOffset"]) for m in d.producer.taken
                if m.partition() == partition]

    assert {m.partition() for m in d.producer.taken} == {0, 2}
    assert offsets(0) == list(range(0, 40, 4)) and offsets(2) == list(range(2, 40, 4))
    assert d.backlog_records == 20 and d.holds  # (a checkpoint waits: Stage._held_back)
    d.add(run(41, 2, partition=1, prev=37))  # (after those of its partition waiting)
    d.add(run(40, 1, partition=0, prev=36))
    d.produce_backlog()
    assert offsets(0)[-1] == 40 and offsets(1) == [] and d.backlog_records == 22
    d.partitions_ready(PartitionsReady("dst_t", frozenset({3})))
    d.produce_backlog()
    assert offsets(3) == list(range(3, 40, 4)) and offsets(1) == [] and d.holds
    d.partitions_ready(PartitionsReady("dst_t", frozenset({1})))
    d.produce_backlog()
    assert offsets(1) == [*range(1, 40, 4), 41, 42]
    assert len(d.producer.taken) == 43 and d.backlog_records == 0 and not d.holds


class Leaders:
    """An admin client of a cluster that creates a topic, shows it in its metadata at once,
    and answers ListOffsets only for the partitions in `taking` (those whose leader has made
    its log), counting the partitions each ListOffsets asks about."""

    def __init__(self):
        self.counts: dict = {}
        self.taking: set = set()
        self.listed: list = []

    def create_topics(self, new_topics, **kwargs):
        self.counts.update((t.topic, t.num_partitions) for t in new_topics)
        return CreatedUnseen._futures([t.topic for t in new_topics])

    def describe_topics(self, collection, **kwargs):
        out = {}
        for topic in collection.topic_names:
            out[topic] = Future()
            if topic in self.counts:
                out[topic].set_result(SimpleNamespace(partitions=[0] * self.counts[topic]))
            else:
                out[topic].set_exception(KafkaException(KafkaError(
                    KafkaError.UNKNOWN_TOPIC_OR_PART)))
        return out

    def list_offsets(self, asked, **kwargs):
        self.listed.append(len(asked))
        out = {}
        for tp in asked:
            out[tp] = Future()
            if (tp.topic, tp.partition) in self.taking:
                out[tp].set_result(None)
            else:
                out[tp].set_exception(KafkaException(KafkaError(
                    KafkaError.NOT_LEADER_FOR_PARTITION)))
        return out


def test_a_topic_is_answered_once_shown_and_each_partition_once_its_leader_takes_records(
        monkeypatch):
    """The Preparer answers a topic it created as soon as its metadata shows it, naming the
    partitions not taking records yet, then each of those as it answers ListOffsets (the
    partitions settling asked about together, OFFSETS_PER_REQUEST a request), and those left
    after READY_SECONDS all the same."""
    monkeypatch.setattr(preparer, "OFFSETS_PER_REQUEST", 5)
    clock = [0.0]
    monkeypatch.setattr(preparer.time, "monotonic", lambda: clock[0])
    admin, p = Leaders(), Preparer({})
    admin.taking = {("a", 0), ("a", 2), ("b", 1)}
    answers = p._topic_answers(admin, [("a", 4, None), ("b", 2, None)])
    assert answers == [TopicAnswer("a", 4, True, None, frozenset({1, 3})),
                       TopicAnswer("b", 2, True, None, frozenset({0}))]
    assert admin.listed == [5, 1]
    admin.taking |= {("a", 3), ("b", 0)}
    assert p._topic_answers(admin, []) == [PartitionsReady("a", frozenset({3})),
                                           PartitionsReady("b", frozenset({0}))]
    assert p._topic_answers(admin, []) == []
    assert admin.listed[2:] == [3, 1]  # (only those still settling)
    clock[0] = preparer.READY_SECONDS
    assert p._topic_answers(admin, []) == [PartitionsReady("a", frozenset({1}))]
    assert p._topic_answers(admin, []) == [] and not p._settling


class CreatedUnseen:
    """An admin client of a cluster that creates a topic and then, loaded, does not show it
    in its metadata (Apache Kafka publishes its metadata late under load)."""

    @staticmethod
    def _futures(topics, result=None, error=None) -> dict:
        out = {}
        for topic in topics:
            out[topic] = Future()
            if error is None:
                out[topic].set_result(result)
            else:
                out[topic].set_exception(KafkaException(KafkaError(error)))
        return out

    def describe_topics(self, collection, **kwargs):
        return self._futures(collection.topic_names, error=KafkaError.UNKNOWN_TOPIC_OR_PART)

    def create_topics(self, new_topics, **kwargs):
        return self._futures([t.topic for t in new_topics])


def test_a_topic_created_but_not_yet_in_the_metadata_is_waited_for_never_given_up(monkeypatch):
    monkeypatch.setattr(preparer, "SETTLE_SECONDS", 0.0)
    p = Preparer({})
    answer, = p._topic_answers(CreatedUnseen(), [("dst_t", 4, None)])
    assert answer.partitions == 0 and answer.error.code() in CLUSTER_UNAVAILABLE
    d, refused, _, producers = destination()
    d.add(run(0, 3))
    d.produce_backlog()
    d.topic_answered(answer)
    monkeypatch.setattr(destination_module.time, "monotonic",
                        lambda: 10 * TOPIC_GIVE_UP_SECONDS + 1)
    d.topic_answered(answer)  # (asked again, and again unseen, long after)
    d.produce_backlog()
    assert d.backlog_records == 3 and refused == [] and len(producers) == 1  # no dead letter
