"""What the writer's rooms (diode.writer) are given, without a broker: the receiver's settings
from a topology, a Metrics, a log, and a producer that holds what it is handed."""

import logging

from diode.link import runs
from diode.link.records import Record
from diode.runtime.metrics import Metrics
from diode.runtime.topology import from_dict

LOG = logging.getLogger("diode.test.writer")


def settings(**receiver):
    """The receiver's settings, with these (topology keys: "missing.records.topic": "m")."""
    return from_dict({
        "link": {"port": 40000, "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"}, **receiver}}).receiver


def metrics() -> Metrics:
    return Metrics({"stage": "kafka_writer"})


def run(first: int, n: int, partition: int = 0, topic: str = "t", prev: int | None = None,
        partitions: int = 4):
    """A run of records first..first+n-1 of topic[partition], continuing the chain."""
    recs = [Record(topic, partition, o, 1000 + o, 1, b"k%d" % o, b"v%d" % o, (),
                   (first - 1 if prev is None else prev) if o == first else o - 1)
            for o in range(first, first + n)]
    return runs.Run.decode(runs.from_records(recs, partitions))


class Message:
    """A record as a delivery report gives it back."""

    def __init__(self, topic, value, key, partition=-1, headers=None):
        self._topic, self._value, self._key = topic, value, key
        self._partition, self._headers = partition, headers

    def topic(self):
        return self._topic

    def value(self):
        return self._value

    def key(self):
        return self._key

    def partition(self):
        return self._partition

    def headers(self):
        return self._headers


class FakeProducer:
    """A producer whose queue takes `room` records (then BufferError), holds them until
    `acknowledge` (or a flush, when `answers`), and keeps every record it took in `taken`."""

    def __init__(self, room: int = 10**9, answers: bool = True, **config):
        self.config, self.room, self.answers = config, room, answers
        self.held: list = []
        self.taken: list = []

    def produce(self, topic, value=None, key=None, partition=-1, timestamp=0, headers=None,
                on_delivery=None):
        if len(self.held) >= self.room:
            raise BufferError("queue full")
        message = Message(topic, value, key, partition, headers)
        self.held.append(message)
        self.taken.append(message)

    def acknowledge(self) -> None:
        self.held.clear()

    def poll(self, timeout=0):
        return 0

    def flush(self, timeout=0):
        if self.answers:
            self.held.clear()
        return len(self.held)

    def list_topics(self, topic=None, timeout=0):
        return None

    def __len__(self):
        return len(self.held)
