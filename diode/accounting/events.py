"""Moved to diode.kafka.messages (issue 35: one definition of what crosses to Kafka). Kept only
so that stages/kafka_writer.py, and the writer's rooms split from it in another branch of the
issue, import as they do until the merge switches them to diode.kafka.messages; remove it then
(tests/unit/test_structure.py lists the writer as not switched yet)."""

from diode.kafka.messages import (  # noqa: F401
    AUDIT, CLOSED, DIGEST, FILLED, GROUP_CHECKPOINT, HEADERS, HEARTBEAT, MISSING, MISSING_RECORDS,
    MISSING_RECORDS_EVENT, REASON_MEANINGS, REASONS, TOPICS, Event, Field, Header, Reason,
    meaning, reference_markdown)
