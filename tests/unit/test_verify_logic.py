"""Pure logic of the verification plane: offset ranges, the streaming ledger, the per-trigger cap,
errors."""

import json
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from diode.accounting.ranges import holes, merge, overlap, subtract
from diode.spark.kafka_source import cap
from diode.accounting.ledger import PartitionLedger


def runs_of(offsets: set) -> list:
    return merge([(o, o) for o in offsets])


def offsets_of(ranges: list) -> set:
    return {o for a, b in ranges for o in range(a, b + 1)}


@given(st.sets(st.integers(0, 200)), st.sets(st.integers(0, 200)))
def test_range_arithmetic_agrees_with_sets(a, b):
    ra, rb = runs_of(a), runs_of(b)
    assert offsets_of(ra) == a
    assert all(x[1] + 1 < y[0] for x, y in pairwise(ra))  # merged: no adjacent runs left
    assert overlap(ra, rb) == len(a & b)
    assert offsets_of(subtract(ra, rb)) == a - b
    if a:
        assert offsets_of(holes(ra, 250)) == set(range(min(a), 251)) - a


def test_a_hole_is_reported_once_then_filled():
    led = PartitionLedger(grace_ms=1000)
    led.add([(0, 9), (20, 29)], records=20, out_of_order=0)
    assert led.settle(0) == ([(10, 19)], [])
    led.add([(30, 39)], records=10, out_of_order=0)
    assert led.settle(1) == ([], [])  # already reported: not again
    led.add([(12, 13)], records=3, out_of_order=3)  # a resend fills part of it, 13 twice
    assert led.settle(2) == ([], [(12, 13)])
    assert led.open_ranges() == [(10, 11), (14, 19)]
    assert (led.records, led.duplicates, led.out_of_order) == (33, 1, 3)


def test_a_heartbeat_claim_reports_the_tail_only_after_the_grace():
    led = PartitionLedger(grace_ms=1000)
    led.add([(0, 9)], records=10, out_of_order=0)
    led.claim(14, received_ms=None, now_ms=0)
    assert led.settle(500) == ([], [])  # records 10..14 may still be on their way
    led.add([(10, 11)], records=2, out_of_order=0)
    assert led.settle(2000, caught_up=False) == ([], [])  # still reading history
    assert led.settle(2000) == ([(12, 14)], [])
    led.add([(12, 14)], records=3, out_of_order=0)
    assert led.settle(2001) == ([], [(12, 14)])
    assert led.open_ranges() == []


def test_a_heartbeat_chain_start_reports_a_lost_head():
    led = PartitionLedger(grace_ms=0)
    led.add([(5, 9)], records=5, out_of_order=0)
    led.claim(9, None, 0, chain_start=0)  # the sender started at 0: 0..4 never came
    assert led.settle(0) == ([(0, 4)], [])
    led.claim(12, None, 1, chain_start=3)  # a later chain (a restart) changes nothing below
    led.add([(10, 12)], records=3, out_of_order=0)
    assert led.settle(1) == ([], [])
    assert led.open_ranges() == [(0, 4)] and led.head == 0


def test_no_lost_head_is_reported_past_the_destinations_retention():
    led = PartitionLedger(grace_ms=0)
    led.add([(500, 509)], records=10, out_of_order=0, destination_first=1200)
    led.claim(509, None, 0, chain_start=0)  # 0..499 were written, then deleted by retention
    assert led.settle(0) == ([], [])


def test_a_claim_is_judged_by_write_time_while_catching_up_on_history():
    led = PartitionLedger(grace_ms=1000)
    led.add([(0, 9)], records=10, out_of_order=0, written=5_000)
    led.claim(20, received_ms=5_000, now_ms=90_000)  # a heartbeat from long ago
    assert led.settle(200_000, caught_up=False) == ([], [])  # 10..20 may come next batch
    led.add([(10, 15)], records=6, out_of_order=0, written=6_500)  # written after the grace:
    assert led.settle(200_001, caught_up=False) == ([(16, 20)], [])  # 16..20 are not coming


def test_repeats_across_batches_are_duplicates():
    led = PartitionLedger()
    led.add([(0, 4)], records=5, out_of_order=0)
    led.add([(3, 6)], records=4, out_of_order=2)
    assert (led.records, led.duplicates, led.runs) == (9, 2, [(0, 6)])


def test_too_many_holes_settles_the_oldest_and_keeps_memory_bounded():
    led = PartitionLedger(max_runs=3)
    led.add([(o, o) for o in range(0, 20, 2)], records=10, out_of_order=0)  # 9 one-record holes
    missing, _ = led.settle(0)
    assert len(missing) == 9
    assert len(led.runs) == 3 and led.runs[0] == (0, 14)
    assert led.settled == 7 and led.open_ranges() == [(15, 15), (17, 17)]


def test_ledger_survives_a_restart_through_json():
    led = PartitionLedger(grace_ms=1000)
    led.add([(0, 3), (6, 9)], records=8, out_of_order=1)
    led.claim(12, None, 0)
    led.settle(0)
    again = PartitionLedger.from_json(json.loads(json.dumps(led.to_json())), grace_ms=1000)
    assert again.to_json() == led.to_json()
    assert again.settle(5000) == ([(10, 12)], [])


def test_the_trigger_cap_shares_records_by_backlog():
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    end = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50}
    assert cap(start, end, 5000) == end  # under the cap: everything
    capped = cap(start, end, 100)
    assert capped == {("t", 0): 90, ("t", 1): 110, ("t", 2): 50}
    assert sum(capped[tp] - start[tp] for tp in end) == 100
    odd = cap({("a", 0): 0, ("a", 1): 0, ("a", 2): 0}, {("a", 0): 10, ("a", 1): 10,
                                                          ("a", 2): 10}, 10)
    assert sum(odd.values()) == 10 and max(odd.values()) - min(odd.values()) == 1


def test_an_unreachable_cluster_is_a_clear_error_not_an_empty_audit():
    import pytest

    from diode.spark.kafka_source import KafkaBatchReader
    from tests.conftest import free_port
    bootstrap = f"127.0.0.1:{free_port()}"  # nothing listens there
    reader = KafkaBatchReader({"kafka.bootstrap.servers": bootstrap, "subscribe": "t",
                               "metadatatimeoutseconds": "2"})
    with pytest.raises(RuntimeError, match=f"cannot list the topics of {bootstrap}"):
        reader.partitions()


def test_records_without_a_topic_id_are_allowed_only_where_digests_prove_the_rest(capsys):
    """--allow-without-topic-id says which records pass the digests' proof unproven: without
    --digest-topic it would do nothing, so it is refused (exit 2) before Spark starts."""
    from diode import cli
    args = cli.build_parser().parse_args(["verify", "--bootstrap", "127.0.0.1:1",
                                          "--allow-without-topic-id"])
    assert args.func(args) == 2
    assert "give it with --digest-topic" in capsys.readouterr().err
