"""Which source partitions a reader should read, found off its loop.

Asking a cluster for its topics, and for the committed offsets of new partitions, waits on the
cluster: seconds when it is slow or unreachable. A kafka_reader asking in its own loop stops for
that long, and so do its heartbeats, and the receiver takes a slow source cluster for a dead link.
A PartitionWatcher asks from a thread of its own, with a client of its own (a confluent_kafka
client is not shared with the loop's), every `interval` seconds, and hands what it found to the
loop through a small queue: the loop never waits on the cluster.
"""

import queue
import threading
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaException, TopicPartition

from diode.kafka.clients import partition_counts

COMMITTED_TIMEOUT = 10.0
RETRY_SECONDS = 1.0


class Found(NamedTuple):
    counts: dict        # topic -> partition count
    new: list           # TopicPartition of partitions not handed over before, with the
    #                     committed offset (negative: none committed)
    error: str | None   # why the cluster could not be read this time (counts and new empty)


class PartitionWatcher:
    """`owned(counts)` -> the (topic, partition) pairs this reader reads, of those counts."""

    def __init__(self, config: dict, owned: Callable[[dict], set], interval: float):
        self.config, self.owned, self.interval = config, owned, interval
        self.found: queue.Queue = queue.Queue(maxsize=4)
        self._stop = threading.Event()
        self._handed: set = set()  # pairs whose committed offsets went to the loop
        self._thread = threading.Thread(target=self._run, name="partition-watcher", daemon=True)

    def start(self) -> "PartitionWatcher":
        self._thread.start()
        return self

    def take(self) -> list:
        """What was found since the last call, oldest first (never waits)."""
        out = []
        while True:
            try:
                out.append(self.found.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout: float = COMMITTED_TIMEOUT + 5) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        client = Consumer(self.config)
        try:
            while not self._stop.is_set():
                found = self._look(client)
                self._hand(found)
                # (a failure, often a coordinator still loading at start, is retried soon)
                self._stop.wait(self.interval if found.error is None else
                                min(self.interval, RETRY_SECONDS))
        finally:
            client.close()

    def _look(self, client) -> Found:
        try:
            counts = partition_counts(client)
            new = sorted(self.owned(counts) - self._handed)
            committed = client.committed([TopicPartition(t, p) for t, p in new],
                                         timeout=COMMITTED_TIMEOUT) if new else []
        except KafkaException as exc:  # (a timeout too: tried again next time)
            return Found({}, [], str(exc))
        self._handed.update((tp.topic, tp.partition) for tp in committed)
        return Found(counts, committed, None)

    def _hand(self, found: Found) -> None:
        while not self._stop.is_set():
            try:
                self.found.put(found, timeout=0.5)
                return
            except queue.Full:  # the loop is busy: it takes them in order when it can
                continue
