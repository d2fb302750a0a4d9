"""diode.spark.coverage: what a read must cover, judged by offsets (not counts), and the
progress line's rate. Pure logic, no broker (the reads themselves: test_verify, test_digests)."""

from diode.spark.command import rate
from diode.spark.coverage import Extent, describe, short_watermarks, shortfalls


def test_a_read_to_the_last_record_is_complete_whatever_the_offsets_between():
    held = {("t", 0): Extent(start=0, end=10, first=0, last=9, high=10),
            # compacted: records at 3, 7 and 12 only; a transaction marker at 13
            ("t", 1): Extent(start=0, end=14, first=3, last=12, high=14),
            ("t", 2): Extent(start=5, end=5, first=None, last=None, high=5)}  # empty
    assert shortfalls(held, {("t", 0): (0, 9), ("t", 1): (3, 12)}) == []


def test_a_read_short_of_the_last_or_first_record_names_the_partition_and_the_offsets():
    held = {("t", 0): Extent(0, 5, 0, 4, high=1),  # Tansu: "latest" says 1, the end is 5
            ("t", 1): Extent(0, 200, 0, 199, 200),
            ("t", 2): Extent(0, 3, 0, 2, 3)}
    assert shortfalls(held, {("t", 0): (0, 0), ("t", 1): (120, 199)}) == [
        "t[0]: read to offset 0, but it holds records to offset 4: offsets 1..4 not read "
        "(4 offsets)",
        "t[1]: read from offset 120, but it held records from offset 0 when the audit began: "
        "offsets 0..119 not read (120 offsets; removed by retention or deleted meanwhile?)",
        "t[2]: nothing read of the records at offsets 0..2"]
    assert short_watermarks(held) == ["t[0]"]
    assert describe(held) == "3 partitions, offsets 0..4, 0..199 and 0..2 to read"


def test_the_rate_is_records_over_seconds_never_0_when_records_were_read():
    assert rate(5, 12.6) == "0.4"
    assert rate(5, 10.8) == "0.46"
    assert rate(415, 10) == "41.5"
    assert rate(1_000_000, 30.1) == "33223"
    assert rate(0, 3) == "0"
