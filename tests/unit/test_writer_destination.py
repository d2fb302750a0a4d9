"""The writer's destination room (diode.writer.destination) against a producer that holds what
it is handed: records written in order with their provenance, a full queue waited out without
loss, a topic given up sending its records to the dead-letter topic (or reporting them refused),
a refused record named from the runs produced, and a checkpoint's flush told when it is done."""

from confluent_kafka import KafkaError

from diode.kafka.preparer import TopicAnswer
from diode.writer.destination import Destination
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
