"""Kafka records as small immutable values (tests, rare paths: the data path moves runs,
diode.link.runs), and which writer owns a source partition."""

from typing import NamedTuple
import zlib

from diode.kafka import messages
from diode.kafka.identity import NO_INCARNATION

# confluent_kafka's TIMESTAMP_NOT_AVAILABLE, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME
TIMESTAMP_NOT_AVAILABLE = 0
# prev_offset of a record sent again by `diode resend` (outside any chain)
RESEND = -2


class Record(NamedTuple):
    """One Kafka record as read from the source cluster."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple  # ((name: str, value: bytes | None), ...)
    # The offset of the record the sender sent before this one from the same partition, -1
    # for the first record of a chain (diode.accounting.ordering explains how gaps are found from
    # it), or RESEND.
    prev_offset: int = -1
    # Which incarnation of the source partition it belongs to: 16 bytes, the source topic's id
    # (diode.kafka.identity). Offsets mean something only within one incarnation.
    incarnation: bytes = NO_INCARNATION


def provenance_headers(record: Record) -> list:
    """The record's own headers plus its provenance, as diode.kafka.messages.provenance_headers
    builds them (sourceTopicId only when its incarnation is known)."""
    return messages.provenance_headers(
        record.topic, record.partition,
        record.incarnation if record.incarnation != NO_INCARNATION else None,
        (record.offset,), (record.headers,))[0]


def partition_owner(topic: str | bytes, partition: int, owners: int) -> int:
    """Which of `owners` workers owns a source partition (the topic as str, or as the UTF-8
    bytes a run's header holds). Stable across processes and runs (Python's hash() is salted
    per process, so it cannot be used)."""
    return (zlib.crc32(topic if isinstance(topic, bytes) else topic.encode()) + partition) \
        % owners
