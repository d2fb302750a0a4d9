"""diode.accounting.events: an event is built with exactly its defined fields, and the records
diode writes outside the writer's events (group checkpoints) are the ones defined."""

import json

import pytest

from diode.accounting import events
from diode.kafka import groups


def test_an_event_is_built_with_exactly_its_fields_in_their_order():
    fields = dict(detectedAt=3, sourceTopic="t", sourcePartition=0, sourceTopicId=None,
                  firstOffset=1, lastOffset=2, reason="gap")
    assert list(events.MISSING.build(**fields, ticket=None)) == list(events.MISSING.names)
    with pytest.raises(ValueError, match="fields missing \\['ticket'\\]"):
        events.MISSING.build(**fields)
    with pytest.raises(ValueError, match="not defined \\['ticket'\\]"):
        events.FILLED.build(**fields, ticket="x")


def test_a_group_checkpoint_record_has_exactly_the_defined_fields():
    key, value = groups.checkpoint_record("app", "orders", 0, 10, "high.orders", 0, 7,
                                          bytes(16), now_ms=5)
    assert list(json.loads(value)) == list(events.GROUP_CHECKPOINT.names)
    assert list(json.loads(key)) == list(events.GROUP_CHECKPOINT.names[:3])


def test_the_audits_spark_schema_is_the_definitions():
    assert events.AUDIT.spark_schema() == (
        "type string, sourceTopic string, sourcePartition int, sourceTopicId string, "
        "firstOffset long, lastOffset long, reason string, detectedAt long, batch long")
