"""The soak's traffic: records produced to the source topics at a steady rate, each one
checkable on its own.

Every record has a key (one of 1000), a value whose size is drawn from a size mix, and two
headers: `soak.seq` (its number in this soak, counted from 0) and `soak.crc` (the crc32 of its
value, hex). The value starts with the sequence number, so no two values are alike. The audit
compares each destination record with its source record (key, value, headers), and checks the
crc32 too, so a record altered anywhere is found even without the source.
"""

import logging
import random
import threading
import time
import zlib
from dataclasses import dataclass

from diode.errors import DiodeError

SEQ_HEADER = "soak.seq"
CRC_HEADER = "soak.crc"
DEFAULT_SIZES = "100:0.6,1000:0.3,10000:0.1"
TICK = 0.01  # produce what is due every 10 ms
SIZES = 4096  # record sizes drawn from the mix, taken in turn
STARTS = 65536  # places in the random blob where a record's value may start
# librdkafka's log lines of the soak's own clients (the traffic's producer, its admin clients):
# to soak.log through this logger (served by poll()), never to the terminal
KAFKA_LOG = logging.getLogger("diode.soak.kafka")


@dataclass(frozen=True)
class Rate:
    """What --rate asked for: records per second, or Mbit/s turned into records per second
    by the size mix's mean."""
    records_per_second: float
    text: str

    @staticmethod
    def parse(text: str, mean_size: float) -> "Rate":
        t = str(text).strip().lower()
        try:
            for unit in ("mbit/s", "mbit", "mbps"):
                if t.endswith(unit):
                    mbps = float(t[:-len(unit)])
                    if mbps <= 0:
                        raise Rate.bad(text)
                    return Rate(mbps * 1e6 / 8 / mean_size, text)
            n = float(t.removesuffix("/s"))
        except ValueError:
            raise Rate.bad(text) from None
        if n <= 0:
            raise Rate.bad(text)
        return Rate(n, text)

    @staticmethod
    def bad(text) -> DiodeError:
        return DiodeError(f"--rate {text!r}: give records per second (5000) or Mbit/s "
                          "(20mbps), above 0")


def parse_sizes(text: str) -> list[tuple[int, float]]:
    """'100:0.6,1000:0.3,10000:0.1' -> [(100, 0.6), ...]: value sizes in bytes and their
    weights; a bare '200' is every record 200 bytes."""
    mix = []
    try:
        for part in str(text).split(","):
            size, _, weight = part.partition(":")
            mix.append((int(size), float(weight or 1)))
    except ValueError:
        raise DiodeError(f"--sizes {text!r}: give SIZE[:WEIGHT],... (e.g. {DEFAULT_SIZES})") \
            from None
    if not mix or any(s < 16 or s > 8 << 20 or w <= 0 for s, w in mix):
        raise DiodeError(f"--sizes {text!r}: sizes from 16 bytes to 8 MiB, weights above 0")
    return mix


def mean_size(mix: list) -> float:
    total = sum(w for _, w in mix)
    return sum(s * w for s, w in mix) / total


class Records:
    """Record number n, the same every time for the same seed and mix."""

    def __init__(self, topics: list[str], partitions: int, mix: list, seed: int):
        self.topics, self.partitions = topics, partitions
        rng = random.Random(seed)
        self.blob = rng.randbytes(max(s for s, _ in mix) + STARTS)
        sizes = [s for s, _ in mix]
        self.sizes = rng.choices(sizes, [w for _, w in mix], k=SIZES)

    def make(self, n: int) -> tuple:
        """(topic, partition, key, value, headers) of record n."""
        size = self.sizes[n % SIZES]
        head = b"%012d|" % n
        start = (n * 7919) % STARTS
        value = head + self.blob[start:start + size - len(head)]
        topic = self.topics[n % len(self.topics)]
        partition = (n // len(self.topics)) % self.partitions
        headers = [(SEQ_HEADER, str(n).encode()),
                   (CRC_HEADER, b"%08x" % zlib.crc32(value))]
        return topic, partition, b"k%03d" % (n % 1000), value, headers


def cost_per_record(records: Records, n: int = 20000) -> float:
    """CPU seconds the traffic thread spends per record (making it and handing it to
    librdkafka), measured on a producer that reaches no broker: the limit of what this
    machine can produce, before anything starts."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": "127.0.0.1:9", "queue.buffering.max.messages": n + 1,
                  "queue.buffering.max.kbytes": 4 << 20, "message.timeout.ms": 1000,
                  "log_level": 0})
    started = time.thread_time()
    for i in range(n):
        topic, partition, key, value, headers = records.make(i)
        p.produce(topic, value, key, partition=partition, headers=headers,
                  on_delivery=_ignore)
    took = time.thread_time() - started
    p.purge()
    p.flush(0)
    return took / n


def _ignore(err, msg) -> None:
    pass


class Traffic:
    """Produces records at `rate` per second in a thread until stopped. `acked` counts the
    records the source acknowledged (the soak's "produced"); `failed` those it refused;
    `behind` how many records the thread is behind its schedule (a paused source)."""

    def __init__(self, kafka: dict, records: Records, rate: float):
        self.kafka, self.records, self.rate = kafka, records, rate
        self.next = 0
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []
        self.behind = 0
        self.producer = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-traffic", daemon=True)

    def start(self) -> "Traffic":
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop producing and wait up to `timeout` for the source's acknowledgements."""
        self._stop.set()
        self._thread.join()
        if self.producer is not None:
            self._flush(timeout)
            self.producer = None  # (its threads would go on calling a stopped broker)

    def _run(self) -> None:
        from confluent_kafka import Producer
        self.producer = Producer({**self.kafka, "enable.idempotence": True, "linger.ms": 5,
                                  "queue.buffering.max.messages": 200000,
                                  "message.timeout.ms": 600000, "logger": KAFKA_LOG})
        started = time.monotonic()
        while not self._stop.wait(TICK):
            due = int((time.monotonic() - started) * self.rate)
            while self.next < due and not self._stop.is_set():
                topic, partition, key, value, headers = self.records.make(self.next)
                try:
                    self.producer.produce(topic, value, key, partition=partition,
                                          headers=headers, on_delivery=self._delivered)
                except BufferError:  # the source is slow or paused: wait for it
                    self.producer.poll(0.1)
                    continue
                self.next += 1
            self.behind = due - self.next
            self.producer.poll(0)

    def _flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.producer) and time.monotonic() < deadline:
            self.producer.poll(0.2)

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed += 1
            if len(self.errors) < 20:
                self.errors.append(str(err))
