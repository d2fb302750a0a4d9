"""Kafka for PySpark without Maven: a Python data source over confluent-kafka.

`spark.read.format("diode_kafka")` takes the native Kafka source's option names and gives its
schema (key, value, topic, partition, offset, timestamp, timestampType, headers), so a job can
switch to `format("kafka")` when spark-sql-kafka is on the classpath (`choose_format`).

Options: `kafka.*` (librdkafka settings, e.g. kafka.bootstrap.servers), `subscribe` (comma
separated topics) or `subscribePattern` (a regular expression), `startingOffsets` ("earliest"
or JSON {"topic": {"0": 42}}), `endingOffsets` ("latest" or JSON, exclusive), and
`maxRecordsPerPartition` (default 1 000 000) to split large ranges over several tasks.

"Latest" is read as "until the broker says end of partition" (librdkafka's partition EOF), not
from ListOffsets: some brokers (the embedded Tansu among them) answer ListOffsets wrongly, and a
reader that trusted it would silently miss records. Planned split boundaries use the watermark
only as a hint; the last split of each partition reads to the real end.

Kafka clients are created inside `read()`, on the executors: the reader object itself must
pickle. Rows are yielded as Arrow record batches.
"""

import json
import re

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, "
          "headers array<struct<key: string, value: binary>>")
BATCH_ROWS = 10000


class KafkaSplit(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int | None):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def kafka_config(options: dict) -> dict:
    conf = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    conf.setdefault("group.id", "diode-spark")
    conf.update({"enable.auto.commit": False, "enable.partition.eof": True})
    return conf


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls):
        return "diode_kafka"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        # Spark's options are case-insensitive (it may hand them over lower-cased)
        return KafkaBatchReader({k.lower(): v for k, v in self.options.items()})


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: dict):
        if "kafka.bootstrap.servers" not in options:
            raise ValueError("diode_kafka: option kafka.bootstrap.servers is required")
        if not options.get("subscribe") and not options.get("subscribepattern"):
            raise ValueError("diode_kafka: give subscribe or subscribePattern")
        self.options = options

    def partitions(self):
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer(kafka_config(self.options))
        try:
            topics = c.list_topics(timeout=10).topics
            names = [t for t in self.options.get("subscribe", "").split(",") if t]
            pattern = self.options.get("subscribepattern")
            wanted = sorted(t for t in topics if t in names or
                            (pattern and re.fullmatch(pattern, t)))
            starting = _offsets(self.options.get("startingoffsets", "earliest"))
            ending = _offsets(self.options.get("endingoffsets", "latest"))
            step = int(self.options.get("maxrecordsperpartition", 1_000_000))
            splits = []
            for topic in wanted:
                for p in sorted(topics[topic].partitions):
                    low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    start = max(low, _pick(starting, topic, p, low))
                    end = _pick(ending, topic, p, None)
                    hint = end if end is not None else high  # only a hint when "latest"
                    while hint - start > step:
                        splits.append(KafkaSplit(topic, p, start, start + step))
                        start += step
                    splits.append(KafkaSplit(topic, p, start, end))
            return splits
        finally:
            c.close()

    def read(self, split: KafkaSplit):
        import pyarrow as pa
        from confluent_kafka import Consumer, KafkaError, TopicPartition
        c = Consumer(kafka_config(self.options))
        c.assign([TopicPartition(split.topic, split.partition, split.start)])
        cols = _empty()
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
                    if split.end is not None and m.offset() >= split.end:
                        done = True
                        break
                    ts_type, ts = m.timestamp()
                    cols["key"].append(m.key())
                    cols["value"].append(m.value())
                    cols["topic"].append(m.topic())
                    cols["partition"].append(m.partition())
                    cols["offset"].append(m.offset())
                    cols["timestamp"].append(ts * 1000 if ts_type else None)  # µs
                    cols["timestampType"].append(ts_type - 1 if ts_type else -1)
                    cols["headers"].append([{"key": k, "value": v}
                                            for k, v in (m.headers() or [])])
                    if len(cols["offset"]) >= BATCH_ROWS:
                        yield _batch(pa, cols)
                        cols = _empty()
            if cols["offset"]:
                yield _batch(pa, cols)
        finally:
            c.close()


def _empty() -> dict:
    return {k: [] for k in ("key", "value", "topic", "partition", "offset", "timestamp",
                            "timestampType", "headers")}


def _batch(pa, cols):
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return pa.RecordBatch.from_arrays([
        pa.array(cols["key"], pa.binary()), pa.array(cols["value"], pa.binary()),
        pa.array(cols["topic"], pa.string()), pa.array(cols["partition"], pa.int32()),
        pa.array(cols["offset"], pa.int64()),
        pa.array(cols["timestamp"], pa.timestamp("us", tz="UTC")),
        pa.array(cols["timestampType"], pa.int32()),
        pa.array(cols["headers"], pa.list_(header)),
    ], names=list(cols))


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


def choose_format(spark, mode: str = "auto") -> str:
    """`kafka` (spark-sql-kafka, when on the classpath) or this source, `diode_kafka`."""
    if mode == "python":
        return _register(spark)
    if mode == "native":
        return "kafka"
    try:
        spark._jvm.java.lang.Class.forName(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider")
        return "kafka"
    except Exception:
        return _register(spark)


def _register(spark) -> str:
    spark.dataSource.register(KafkaDataSource)
    return "diode_kafka"
