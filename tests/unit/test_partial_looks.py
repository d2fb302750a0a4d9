"""A PartitionWatcher's look hands over what the source cluster answered and asks again for the
rest: a partition whose leader is not elected yet, whose committed offset or end was not
answered, or a topic whose id was not given, never holds up the partitions that are ready (at
10 000 partitions on Apache Kafka, one such partition failed the whole look for minutes), and
a topic not answered for is not taken as gone. The cluster is played by the test (its answers
per partition are the point, which a broker gives only by chance while it makes logs)."""

from concurrent.futures import Future

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import OffsetSpec

from diode.kafka import refresh
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


class Listed(Cluster):
    """A cluster whose partitions have log starts and ends, that notes what was listed."""

    def __init__(self, topics: dict):
        super().__init__(topics)
        self.start = {(t, p): 0 for t, n in topics.items() for p in range(n)}
        self.end = {(t, p): 10 for t, n in topics.items() for p in range(n)}
        self.asked: list = []  # per list_offsets call: the pairs asked
        self.retention = dict.fromkeys(topics, 1000)
        self.described: list = []  # per describe_configs call: the topics asked

    def list_offsets(self, asked: dict, request_timeout=None):
        self.asked.append({(tp.topic, tp.partition) for tp in asked})
        return {tp: answered(Said(offset=(self.start if spec == OffsetSpec.earliest()
                                          else self.end)[(tp.topic, tp.partition)]))
                for tp, spec in asked.items()}

    def describe_configs(self, resources, request_timeout=None):
        self.described.append({r.name for r in resources})
        return {r: answered({"retention.ms": Said(value=str(self.retention[r.name]))})
                for r in resources}

    def listed(self) -> set:
        pairs, self.asked = set().union(*self.asked), []
        return pairs

    def settings_asked(self) -> set:
        topics, self.described = set().union(*self.described), []
        return topics


def test_a_marked_watcher_lists_the_starts_and_ends_that_moved_and_a_turn_of_the_rest():
    """A kafka_reader's watcher lists (ListOffsets) only the log starts and ends its reader's
    fetches saw move, and a turn of the others, and describes the settings of a turn of the
    topics: an idle reader of 1 000 partitions listed every end every 5 s and every log start
    and end and every topic's configs every 10 s (4.3 to 5.0 % of a core idle)."""
    cluster = Listed({"a": 6, "b": 6, **{f"t{n}": 1 for n in range(10)}})
    every = set(cluster.start)
    w = PartitionWatcher({"bootstrap.servers": "x:1", "group.id": "g"},
                         lambda counts: {(t, p) for t, n in counts.items() for p in range(n)},
                         interval=5.0, state=10.0, marked=True)
    marks = {tp: (0, 10) for tp in every}  # (what the reader's fetches saw)
    first = w._look(cluster, cluster, listing=True, woken=False, stating=True, marks=marks)
    assert cluster.listed() == every and first.starts == dict.fromkeys(every, 0)

    def state():
        return w._look(cluster, cluster, listing=False, woken=False, stating=True, marks=marks)
    # nothing moved: a turn of 12 / STATE_TURN_LOOKS (6) partitions, the rest as last listed
    assert cluster.settings_asked() == set(cluster.topics)
    found = state()
    turn = cluster.listed()
    assert len(turn) == 4 and found.starts == dict.fromkeys(every, 0)
    assert len(cluster.settings_asked()) == 2 and set(found.settings) == set(cluster.topics)
    # records deleted from b[3] by retention: its fetches' log start moved, it is listed
    cluster.start[("b", 3)] = 4
    marks[("b", 3)] = (4, 10)
    found = state()
    assert ("b", 3) in cluster.listed() and found.starts[("b", 3)] == 4
    # every partition is listed, every topic's settings described, within STATE_TURN_LOOKS
    # looks, moved or not: a retention changed is seen
    cluster.retention["t3"] = 5
    cluster.settings_asked()
    seen, described = set(), set()
    for _ in range(refresh.STATE_TURN_LOOKS):
        found = state()
        seen |= cluster.listed()
        described |= cluster.settings_asked()
    assert seen == every and described == set(cluster.topics)
    assert found.settings["t3"][0] == 5
    # a listing between asks no end: the topics have ids, the reader's fetches give the ends
    w._look(cluster, cluster, listing=True, woken=False)
    assert cluster.listed() == set()
    # a reader held back (no watermarks) has everything listed, and so has one woken
    w._look(cluster, cluster, listing=False, woken=False, stating=True, marks=None)
    assert cluster.listed() == every
    w._look(cluster, cluster, listing=False, woken=True)
    assert cluster.listed() == every


def test_a_marked_watcher_checks_between_listings_the_ids_of_the_topics_read():
    """Between listings (every refresh.topics.interval.seconds) a kafka_reader's watcher checks
    every identity.check.interval.ms the ids of the topics its reader read records of since
    they were last checked, not of every topic (DescribeTopics of 200 topics every second at
    1 000 idle partitions): a topic recreated and refilled is read, so seen at the next look;
    one recreated with nothing read at the next listing. Topics not checked are not gone."""
    cluster = Listed({"a": 2, "b": 2, "c": 2})
    checked: list = []
    ids = {"a": 1, "b": 2, "c": 3}

    def describe_topics(topics, request_timeout=None):
        checked.append(set(topics.topic_names))
        return {t: answered(Said(topic_id=Uuid(ids[t]))) for t in topics.topic_names}
    cluster.describe_topics = describe_topics
    w = PartitionWatcher({"bootstrap.servers": "x:1", "group.id": "g"},
                         lambda counts: {(t, p) for t, n in counts.items() for p in range(n)},
                         interval=5.0, state=10.0, marked=True)
    first = w._look(cluster, cluster, listing=True, woken=False)
    assert checked.pop() == {"a", "b", "c"} and len(first.new) == 6 and first.whole
    # nothing read: nothing checked, nothing gone
    idle = w._look(cluster, cluster, listing=False, woken=False)
    assert not checked
    assert idle.error is None and not idle.gone and not idle.resets and not idle.whole
    # a recreated and refilled: its records read, it is checked and found recreated
    ids["a"] = 11
    w.read({"a"})
    found = w._look(cluster, cluster, listing=False, woken=False)
    # (then, a topic found recreated, every topic is listed and checked)
    assert checked[0] == {"a"} and set(found.resets) == {"a"} and not found.gone
    checked.clear()
    # checked once: not again until read again
    w._look(cluster, cluster, listing=False, woken=False)
    assert not checked
    # b recreated with nothing read: seen at the next listing
    ids["b"] = 12
    assert not w._look(cluster, cluster, listing=False, woken=False).resets
    listed = w._look(cluster, cluster, listing=True, woken=False)
    assert set(listed.resets) == {"b"} and listed.whole


def test_partitions_whose_watermarks_the_reader_has_not_taken_yet_are_listed_in_turn():
    """Over 10 000 partitions a reader takes its fetches' watermarks in turn (about 60 in the
    20 ms it gives them at each look), so for half an hour most partitions had none: each was
    listed at every look at the state (ListOffsets of nearly 10 000 partitions every 10 s, the
    largest part of an idle reader's CPU). Listed once, they are now listed in turn, and as
    soon as the reader gives their watermarks."""
    cluster = Listed({f"t{n}": 2 for n in range(6)})
    every = set(cluster.start)
    w = PartitionWatcher({"bootstrap.servers": "x:1", "group.id": "g"},
                         lambda counts: {(t, p) for t, n in counts.items() for p in range(n)},
                         interval=5.0, state=10.0, marked=True)
    marks = {("t0", 0): (0, 10)}  # (the only partition whose watermarks it has taken yet)
    w._look(cluster, cluster, listing=True, woken=False, stating=True, marks=marks)
    assert cluster.listed() == every

    def state():
        w._look(cluster, cluster, listing=False, woken=False, stating=True, marks=marks)
        return cluster.listed()
    assert len(state()) == 2  # (a turn: 12 / STATE_TURN_LOOKS)
    marks[("t4", 1)] = (0, 10)  # (taken now: listed, then as the others)
    assert ("t4", 1) in state()
    seen = set()
    for _ in range(refresh.STATE_TURN_LOOKS):
        seen |= state()
    assert seen == every


def test_the_ends_a_reader_fetched_are_taken_a_bounded_time_at_a_look_the_rest_at_the_next(
        monkeypatch):
    """After a look a kafka_reader takes the ends its fetches saw of the partitions it read
    since (consumer.get_watermark_offsets(cached=True), each a search of every topic in
    librdkafka: 0.35 ms a partition at 2 000 topics). 1 000 of them at once held its loop
    6.8 s on a loaded machine at 10 000 partitions, and the supervisor killed it for 20 s
    without a heartbeat; now it takes them for MARKS_SECONDS at most (a clock played by the
    test: each call 1 ms), and the others at the next looks, none lost."""
    from stages import kafka_reader

    clock = [0.0]

    class Consumer:
        def get_watermark_offsets(self, tp, cached=False):
            clock[0] += 0.001
            return 0, 100 + tp.partition

    monkeypatch.setattr(kafka_reader.time, "monotonic", lambda: clock[0])
    reader = object.__new__(kafka_reader.Stage)
    reader.consumer = Consumer()
    reader.assigned = {("t", p): 0 for p in range(1000)}
    reader.read_since = set(reader.assigned)
    per_look = int(kafka_reader.MARKS_SECONDS / 0.001)
    taken = {}
    for _ in range(-(-1000 // per_look) + 1):
        ends = reader._fetched_ends()
        assert len(ends) <= per_look + 1
        taken.update(ends)
    assert taken == {("t", p): 100 + p for p in range(1000)} and not reader.read_since
