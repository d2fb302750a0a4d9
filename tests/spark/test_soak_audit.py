"""The soak's audit transform (diode.soak.audit.classify, counts and missing_ranges): known
answers for every way a record can fare, on rows made in memory as the extract functions make
them."""

from diode.soak.audit import KEY, classify, copies_of, counts, missing_ranges

SRC = "sourceTopic string, sourcePartition int, sourceOffset long, sDigest long, producedAt long"
DST = ("sourceTopic string, sourcePartition int, sourceOffset long, dDigest long, "
       "crcBad boolean, writtenAt long, dTimestamp long")
FLAGS = ("sourceTopic string, sourcePartition int, sourceOffset long, reported int, "
         "filled int, reports long, reason string")


def test_every_outcome_of_a_record_is_counted_once(spark):
    # offsets 0..9 of t[0], digest 100 + offset
    s = spark.createDataFrame([("t", 0, o, 100 + o, 1000 + o) for o in range(10)], SRC)
    ok = lambda o, digest=None, crc_bad=False: ("t", 0, o, digest or 100 + o,  # noqa: E731
                                                crc_bad, 2000, 1000)
    d = spark.createDataFrame([
        ok(0), ok(1), ok(1),              # 1 written twice: one duplicate
        ok(2, digest=999),                # 2 altered on the way
        ok(3, crc_bad=True),              # 3 fails its crc32
        ok(4),                            # 4 reported missing but written: a false report
        ok(5),                            # 5 reported, then filled late: fine
        ok(9), ok(9, digest=998),         # 9: one of its two copies differs
    ], DST)
    flags = spark.createDataFrame([
        ("t", 0, 4, 1, 0, 1, "gap"), ("t", 0, 5, 1, 1, 1, "gap"),
        ("t", 0, 6, 1, 0, 2, "gap"),      # 6 lost and reported (twice)
        ("t", 0, 7, 1, 0, 1, "receiver-down"),
    ], FLAGS)                             # 8: lost without a word
    rec = classify(s, copies_of(d), flags)
    assert counts(rec) == {
        "produced": 10, "delivered": 7, "missing_reported": 2, "silent_loss": 1,
        "false_missing": 1, "late_filled": 1, "reported_twice": 1, "duplicates": 2,
        "corrupted": 3}
    corrupted = sorted(r["sourceOffset"] for r in rec.where("corrupted").select(*KEY).collect())
    assert corrupted == [2, 3, 9]


def test_records_not_written_make_ranges_of_consecutive_offsets_with_their_send_times(spark):
    # t[0]: 3..5 lost (4 silently), 6 written, 8 lost; t[1]: 0 lost; u[0]: nothing lost
    lost = {("t", 0, 3): True, ("t", 0, 4): False, ("t", 0, 5): True, ("t", 0, 8): True,
            ("t", 1, 0): True}
    rows = [(t, p, o, 1000 + 10 * o + p, (t, p, o) not in lost, lost.get((t, p, o), False),
             "gap" if lost.get((t, p, o)) else None)
            for t, p in (("t", 0), ("t", 1), ("u", 0)) for o in range(10)]
    rec = spark.createDataFrame(rows, "sourceTopic string, sourcePartition int, sourceOffset "
                                "long, producedAt long, delivered boolean, reported boolean, "
                                "reason string")
    found = sorted(tuple(r) for r in missing_ranges(rec).select(
        "sourceTopic", "sourcePartition", "firstOffset", "lastOffset", "records", "reported",
        "reason", "sentFrom", "sentUntil").collect())
    assert found == [("t", 0, 3, 5, 3, 2, "gap", 1030, 1050),
                     ("t", 0, 8, 8, 1, 1, "gap", 1080, 1080),
                     ("t", 1, 0, 0, 1, 1, "gap", 1001, 1001)]
