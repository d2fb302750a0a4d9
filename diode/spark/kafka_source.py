"""Kafka for PySpark without Maven: a Python data source over confluent-kafka.

`spark.read.format("diode_kafka")` takes the native Kafka source's option names and gives its
schema (key, value, topic, partition, offset, timestamp, timestampType, headers), so a job can
switch to `format("kafka")` when spark-sql-kafka is on the classpath (`choose_format`).

Options: `kafka.*` (librdkafka settings, e.g. kafka.bootstrap.servers), `subscribe` (comma
separated topics), `subscribePattern` (a regular expression) or `assign` (JSON {"topic": [0, 1]},
those partitions only), `startingOffsets` ("earliest"
or JSON {"topic": {"0": 42}}), `endingOffsets` ("latest" or JSON, exclusive; batch only),
`maxOffsetsPerTrigger` (streaming: at most this many records per micro-batch, shared out over
the partitions by backlog, as Spark's own source does) and `maxRecordsPerPartition` (default
1 000 000) to split large ranges over several tasks. `metadataTimeoutSeconds` (default 10)
bounds the wait for the cluster's topic list. `includeHeaders` is accepted for
compatibility (callers pass it for the native source); the headers column is always there.

`spark.read` gives a batch reader, `spark.readStream` a streaming one. Streaming offsets are
{"topic": {"partition": next offset}}; partitions and topics that appear while the query runs
(a `subscribePattern` match, more partitions) are read from their earliest offset.

"Latest" is read as "until the broker says end of partition" (librdkafka's partition EOF), not
from ListOffsets: some brokers (the embedded Tansu among them) answer ListOffsets wrongly, and a
reader that trusted it would silently miss records. Batch: planned split boundaries use the
watermark only as a hint; the last split of each partition reads to the real end. Streaming: the
driver finds each partition's real end by reading from the watermark to the end of partition
(nothing to read on a broker that answers correctly).

Kafka clients are created inside `read()`, on the executors: the reader object itself must
pickle. Rows are yielded as Arrow record batches.
"""

import json
import re

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, "
          "headers array<struct<key: string, value: binary>>")
BATCH_ROWS = 10000


class KafkaSplit(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int | None):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def kafka_config(options: dict) -> dict:
    """The librdkafka settings of a reader given the source's options (`kafka.*`)."""
    return reader_config({k[len("kafka."):]: v for k, v in options.items()
                          if k.startswith("kafka.")})


def reader_config(settings: dict) -> dict:
    """A reader's librdkafka settings: a cluster's `settings` (how to reach it), and what
    reading a partition to its end takes: no commits, an event at the end of each partition."""
    conf = dict(settings)
    conf.setdefault("group.id", "diode-spark")
    conf.update({"enable.auto.commit": False, "enable.partition.eof": True,
                 "auto.offset.reset": "earliest"})
    return conf


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls):
        return "diode_kafka"

    def schema(self):
        return SCHEMA

    # Spark's options are case-insensitive (it may hand them over lower-cased)
    def reader(self, schema):
        return KafkaBatchReader({k.lower(): v for k, v in self.options.items()})

    def streamReader(self, schema):
        return KafkaStreamReader({k.lower(): v for k, v in self.options.items()})


class _KafkaReader:
    """What the batch and the streaming readers share: options, topic discovery, `read`."""

    def __init__(self, options: dict):
        if "kafka.bootstrap.servers" not in options:
            raise ValueError("diode_kafka: option kafka.bootstrap.servers is required")
        if not any(options.get(k) for k in ("subscribe", "subscribepattern", "assign")):
            raise ValueError("diode_kafka: give subscribe, subscribePattern or assign")
        self.options = options
        self.step = int(options.get("maxrecordsperpartition", 1_000_000))
        self.metadata_timeout = float(options.get("metadatatimeoutseconds", 10))

    def _partitions(self, consumer) -> list[tuple[str, int]]:
        """The (topic, partition) pairs subscribed to (or assigned), sorted."""
        from confluent_kafka import KafkaException
        if self.options.get("assign"):
            return sorted((t, int(p)) for t, parts in json.loads(self.options["assign"]).items()
                          for p in parts)
        try:
            topics = consumer.list_topics(timeout=self.metadata_timeout).topics
        except KafkaException as e:
            raise RuntimeError(
                f"diode_kafka: cannot list the topics of {self.options['kafka.bootstrap.servers']}"
                f" (is the cluster up and reachable from the driver?): {e}") from e
        names = [t for t in self.options.get("subscribe", "").split(",") if t]
        pattern = self.options.get("subscribepattern")
        return [(t, p) for t in sorted(topics)
                if t in names or (pattern and re.fullmatch(pattern, t))
                for p in sorted(topics[t].partitions)]

    def _split(self, topic: str, partition: int, start: int, hint: int,
               end: int | None) -> list[KafkaSplit]:
        """[start, end) in tasks of at most maxRecordsPerPartition (by the `hint` of the end)."""
        splits = []
        while hint - start > self.step:
            splits.append(KafkaSplit(topic, partition, start, start + self.step))
            start += self.step
        return splits + [KafkaSplit(topic, partition, start, end)]

    def read(self, split: KafkaSplit):
        """The records of one split, as Arrow batches; to end of partition when split.end is
        None. Runs on an executor: the Kafka client is made here."""
        import pyarrow as pa
        from confluent_kafka import Consumer, KafkaError, TopicPartition
        if split.end is not None and split.end <= split.start:
            return
        c = Consumer(kafka_config(self.options))
        c.assign([TopicPartition(split.topic, split.partition, split.start)])
        cols = _Columns(split.topic, split.partition)
        end = split.end
        try:
            done = False
            while not done:
                for m in c.consume(1000, timeout=1.0):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = True
                            break
                        raise RuntimeError(f"{split.topic}[{split.partition}]: {err}")
                    offset = m.offset()
                    if end is not None and offset >= end:
                        done = True
                        break
                    cols.add(m, offset)
                    if cols.rows >= BATCH_ROWS:
                        yield cols.batch(pa)
                        cols = _Columns(split.topic, split.partition)
                    if end is not None and offset >= end - 1:
                        done = True
                        break
            if cols.rows:
                yield cols.batch(pa)
        finally:
            c.close()


class _Columns:
    """One split's records, column by column (headers flattened), for an Arrow batch."""

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition, self.rows = topic, partition, 0
        self.keys, self.values, self.offsets, self.ts, self.ts_types = [], [], [], [], []
        self.h_keys, self.h_values, self.h_ends = [], [], [0]

    def add(self, m, offset: int) -> None:
        self.keys.append(m.key())
        self.values.append(m.value())
        self.offsets.append(offset)
        ts_type, ts = m.timestamp()
        self.ts.append(ts * 1000 if ts_type else None)  # µs
        self.ts_types.append(ts_type - 1 if ts_type else -1)
        headers = m.headers()
        if headers:
            for k, v in headers:
                self.h_keys.append(k)
                self.h_values.append(v)
        self.h_ends.append(len(self.h_keys))
        self.rows += 1

    def batch(self, pa):
        n = self.rows
        headers = pa.ListArray.from_arrays(
            pa.array(self.h_ends, pa.int32()),
            pa.StructArray.from_arrays([pa.array(self.h_keys, pa.string()),
                                        pa.array(self.h_values, pa.binary())],
                                       names=["key", "value"]))
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.ts, pa.timestamp("us", tz="UTC")),
            pa.array(self.ts_types, pa.int32()), headers,
        ], names=["key", "value", "topic", "partition", "offset", "timestamp",
                  "timestampType", "headers"])


class KafkaBatchReader(_KafkaReader, DataSourceReader):
    def partitions(self):
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer(kafka_config(self.options))
        try:
            starting = _offsets(self.options.get("startingoffsets", "earliest"))
            ending = _offsets(self.options.get("endingoffsets", "latest"))
            splits = []
            for topic, p in self._partitions(c):
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                start = max(low, _pick(starting, topic, p, low))
                end = _pick(ending, topic, p, None)
                hint = end if end is not None else high  # only a hint when "latest"
                splits += self._split(topic, p, start, hint, end)
            return splits
        finally:
            c.close()


class KafkaStreamReader(_KafkaReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over [start, end) offsets per partition; `maxOffsetsPerTrigger` caps a
    batch. Trigger.AvailableNow reads up to the ends found when the query starts. The driver
    keeps one consumer to find partition ends (dropped when pickled)."""

    def __init__(self, options: dict):
        super().__init__(options)
        if "endingoffsets" in options:
            raise ValueError("diode_kafka: endingOffsets is for batch queries only")
        self.max_per_trigger = int(options.get("maxoffsetspertrigger", 0)) or None
        self._consumer = None
        self._target = None  # Trigger.AvailableNow: {(topic, partition): end}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_consumer"}

    def __setstate__(self, state):
        self.__dict__.update(state, _consumer=None)

    def _client(self):
        from confluent_kafka import Consumer
        if self._consumer is None:
            self._consumer = Consumer(kafka_config(self.options))
        return self._consumer

    def initialOffset(self) -> dict:
        from confluent_kafka import TopicPartition
        c = self._client()
        starting = _offsets(self.options.get("startingoffsets", "earliest"))
        parts = self._partitions(c)
        ends = real_ends(c, {tp: 0 for tp in parts}) if starting == "latest" else {}
        out = {}
        for topic, p in parts:
            low, _ = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            o = ends[(topic, p)] if starting == "latest" else \
                max(low, _pick(starting, topic, p, low))
            out.setdefault(topic, {})[str(p)] = o
        return out

    def latestOffset(self, start: dict, limit=None) -> dict:
        floor = {(t, int(p)): o for t, parts in start.items() for p, o in parts.items()}
        if self._target is not None:  # AvailableNow: up to the ends found at the start
            ends = self._target
        else:
            c = self._client()
            ends = real_ends(c, {tp: floor.get(tp, 0) for tp in self._partitions(c)})
        ends = {tp: max(e, floor.get(tp, 0)) for tp, e in ends.items()}
        rows = getattr(limit, "max_rows", None)
        if rows is not None:
            ends = cap({tp: floor.get(tp, 0) for tp in ends}, ends, rows)
        out = {}
        for (t, p), o in sorted(ends.items()):
            out.setdefault(t, {})[str(p)] = o
        return out

    def prepareForTriggerAvailableNow(self) -> None:
        c = self._client()
        self._target = real_ends(c, {tp: 0 for tp in self._partitions(c)})

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else \
            ReadAllAvailable()

    def partitions(self, start: dict, end: dict):
        splits = []
        for topic, parts in sorted(end.items()):
            for p, e in sorted(parts.items(), key=lambda kv: int(kv[0])):
                s = start.get(topic, {}).get(p, 0)
                if e > s:
                    splits += self._split(topic, int(p), s, e, e)
        return splits

    def stop(self):
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def real_ends(consumer, floors: dict, timeout: float = 10.0) -> dict:
    """{(topic, partition): the offset after its last record}, read up to end of partition from
    max(floor, the broker's high watermark) since some brokers (Tansu) report a watermark short
    of the end. On a timeout a partition keeps what was found (a later call finds the rest)."""
    import time

    from confluent_kafka import KafkaError, TopicPartition
    ends, assign = {}, []
    for (t, p), floor in floors.items():
        _, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)
        ends[(t, p)] = max(floor, high)
        assign.append(TopicPartition(t, p, ends[(t, p)]))
    if not assign:
        return ends
    consumer.assign(assign)
    open_ = set(ends)
    deadline = time.monotonic() + timeout
    try:
        while open_ and time.monotonic() < deadline:
            for m in consumer.consume(1000, timeout=0.5):
                tp = (m.topic(), m.partition())
                err = m.error()
                if err is None:
                    ends[tp] = max(ends[tp], m.offset() + 1)
                elif err.code() == KafkaError._PARTITION_EOF:
                    open_.discard(tp)
                else:
                    raise RuntimeError(f"{tp[0]}[{tp[1]}]: {err}")
    finally:
        consumer.unassign()
    return ends


def cap(start: dict, end: dict, limit: int) -> dict:
    """`end` lowered so that at most `limit` records are read in all, shared out over the
    partitions in proportion to their backlog (remainders to the largest backlogs)."""
    backlog = {tp: max(0, end[tp] - start.get(tp, 0)) for tp in end}
    total = sum(backlog.values())
    if total <= limit:
        return dict(end)
    share = {tp: limit * n // total for tp, n in backlog.items()}
    left = limit - sum(share.values())
    for tp in sorted(backlog, key=lambda tp: (-(limit * backlog[tp] % total), tp))[:left]:
        share[tp] += 1
    return {tp: start.get(tp, 0) + share[tp] for tp in end}


def _offsets(spec: str):
    if spec in ("earliest", "latest"):
        return spec
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(spec).items()}


def _pick(spec, topic, partition, default):
    """An offset from a startingOffsets/endingOffsets spec (-2 earliest, -1 latest)."""
    if not isinstance(spec, dict):
        return default
    o = spec.get(topic, {}).get(partition, -1 if default is None else -2)
    return default if o < 0 else o


def connector_jars(mode: str) -> list[str]:
    """The jars to add to a new SparkSession for `mode`: for native, Spark's Kafka connector
    (fetched through mvn the first time); for auto, the same when it is in the cache already;
    for python, none. Jars Spark ships itself (Hadoop, Scala, ...) are left out."""
    from pathlib import Path

    import pyspark

    from diode.jars import connector_bundle
    from diode.kafka import maven
    bundle = connector_bundle()
    if mode == "python" or (mode == "auto" and not maven.cached(bundle)):
        return []
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in maven.jars(bundle) if _artifact(Path(j).name) not in shipped]


def _artifact(jar_name: str) -> str:
    """commons-pool2-2.12.0.jar -> commons-pool2"""
    return re.sub(r"-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$", "", jar_name)


def choose_format(spark, mode: str = "auto") -> str:
    """`kafka` (spark-sql-kafka, when on the classpath) or this source, `diode_kafka`."""
    if mode == "python":
        return _register(spark)
    if mode == "native":
        return "kafka"
    try:  # Spark's class loader: it also sees the jars of spark.jars
        if spark._jvm.org.apache.spark.util.Utils.classIsLoadable(
                "org.apache.spark.sql.kafka010.KafkaSourceProvider"):
            return "kafka"
    except Exception:  # noqa: BLE001 - Spark Connect, or no JVM to ask: the Python source
        pass
    return _register(spark)


def _register(spark) -> str:
    spark.dataSource.register(KafkaDataSource)
    return "diode_kafka"
