"""A PartitionWatcher's look hands over what the source cluster answered and asks again for the
rest: a partition whose leader is not elected yet, whose committed offset or end was not
answered, or a topic whose id was not given, never holds up the partitions that are ready (at
10 000 partitions on Apache Kafka, one such partition failed the whole look for minutes), and
a topic not answered for is not taken as gone. The cluster is played by the test (its answers
per partition are the point, which a broker gives only by chance while it makes logs)."""

from concurrent.futures import Future

from confluent_kafka import KafkaError, KafkaException

from diode.kafka.refresh import PartitionWatcher

LEADER_NOT_AVAILABLE = 5
COORDINATOR_LOAD_IN_PROGRESS = 14


def answered(value) -> Future:
    f = Future()
    f.set_result(value)
    return f


def failed(code: int) -> Future:
    f = Future()
    f.set_exception(KafkaException(KafkaError(code)))
    return f


class Uuid:
    def __init__(self, n: int):
        self.n = n

    def get_most_significant_bits(self):
        return 0

    def get_least_significant_bits(self):
        return self.n


class Said:
    """What a described topic, a listed offset or a listed topic carries."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class Cluster:
    """Topics of partitions; what it does not answer for (`unready`: (topic, partition) for
    offsets and committed offsets, a topic for its id), as a broker making their logs."""

    def __init__(self, topics: dict):
        self.topics = topics  # topic -> partition count
        self.no_id: set = set()
        self.no_end: set = set()
        self.no_committed: set = set()
        self.committed_fails = False

    # -- the admin client
    def list_topics(self, timeout=None):
        return Said(cluster_id="c", topics={
            t: Said(error=None, partitions=dict.fromkeys(range(n))) for t, n in
            self.topics.items()})

    def describe_topics(self, topics, request_timeout=None):
        return {t: failed(LEADER_NOT_AVAILABLE) if t in self.no_id else
                answered(Said(topic_id=Uuid(sorted(self.topics).index(t) + 1)))
                for t in topics.topic_names}

    def list_offsets(self, asked: dict, request_timeout=None):
        return {tp: failed(LEADER_NOT_AVAILABLE) if (tp.topic, tp.partition) in self.no_end
                else answered(Said(offset=10)) for tp in asked}

    # -- the consumer
    def committed(self, tps, timeout=None):
        if self.committed_fails:
            raise KafkaException(KafkaError(COORDINATOR_LOAD_IN_PROGRESS))
        return [Said(topic=tp.topic, partition=tp.partition, offset=3, metadata=None, error=(
            KafkaError(COORDINATOR_LOAD_IN_PROGRESS)
            if (tp.topic, tp.partition) in self.no_committed else None)) for tp in tps]


def watcher() -> PartitionWatcher:
    return PartitionWatcher({"bootstrap.servers": "x:1", "group.id": "g"},
                            lambda counts: {(t, p) for t, n in counts.items() for p in range(n)},
                            interval=5.0)


def handed(found) -> set:
    return {(tp.topic, tp.partition) for tp in found.new}


def test_a_look_hands_what_is_ready_and_the_next_the_rest():
    cluster = Cluster({"a": 3, "b": 2, "c": 1})
    cluster.no_id = {"b"}                      # (its leader not elected: no id yet)
    cluster.no_committed = {("a", 2)}          # (its committed offset not answered)
    cluster.no_end = {("a", 1), ("c", 0)}      # (its end not answered)
    w = watcher()
    found = w._look(cluster, cluster, listing=True, woken=False)
    assert found.error is None
    # what is ready is read now: a[0] and a[1] (its end comes later), c[0]
    assert handed(found) == {("a", 0), ("a", 1), ("c", 0)}
    assert {tp: tp.offset for tp in found.new} == {tp: 3 for tp in found.new}
    assert set(found.ends) == {("a", 0), ("a", 2)}
    # the rest is waiting, said why, and not taken as gone
    assert set(found.waiting) == {("a", 2), ("b", 0), ("b", 1)}
    assert "committed offset" in found.waiting[("a", 2)]
    assert "topic id" in found.waiting[("b", 0)]
    assert not found.gone and not found.resets and set(found.incarnations) == {"a", "c"}

    cluster.no_id, cluster.no_committed, cluster.no_end = set(), set(), set()
    again = w._look(cluster, cluster, listing=False, woken=True)
    assert again.error is None and not again.waiting and not again.gone
    assert handed(again) == {("a", 2), ("b", 0), ("b", 1)}  # (and not the others again)
    assert set(again.ends) == {(t, p) for t, n in cluster.topics.items() for p in range(n)}


def test_a_topic_read_whose_id_is_not_answered_is_not_gone_and_a_deleted_one_is():
    cluster = Cluster({"a": 1, "b": 1})
    w = watcher()
    assert handed(w._look(cluster, cluster, listing=True, woken=False)) == {("a", 0), ("b", 0)}
    cluster.no_id = {"b"}
    found = w._look(cluster, cluster, listing=True, woken=False)
    assert found.error is None and not found.gone and not found.new
    del cluster.topics["b"]
    cluster.no_id = set()
    assert w._look(cluster, cluster, listing=True, woken=False).gone == ["b"]


def test_the_coordinator_not_answering_keeps_the_new_partitions_waiting_not_the_look():
    cluster = Cluster({"a": 2})
    cluster.committed_fails = True
    w = watcher()
    found = w._look(cluster, cluster, listing=True, woken=False)
    # the ids and ends are handed (the lineage's), the partitions wait for their offsets
    assert found.error is None and not found.new and set(found.incarnations) == {"a"}
    assert set(found.waiting) == {("a", 0), ("a", 1)} and set(found.ends) == set(found.waiting)
    cluster.committed_fails = False
    assert handed(w._look(cluster, cluster, listing=False, woken=False)) == {("a", 0), ("a", 1)}


def test_a_look_at_which_nothing_answers_fails_whole():
    cluster = Cluster({"a": 2})
    cluster.no_id = {"a"}
    found = watcher()._look(cluster, cluster, listing=True, woken=False)
    assert found.error and not found.new and not found.counts
