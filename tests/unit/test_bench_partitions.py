"""./scripts/bench --partitions: how N partitions are laid out over topics, how its options are
read, and the figures it computes from what it measured (percentiles, idle share, ratios)."""

import sys
from concurrent.futures import Future
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench  # noqa: E402
from benchlib import meter, spread  # noqa: E402


def test_partitions_spread_evenly_over_the_topics():
    assert spread.layout(1000, 200) == [5] * 200
    assert spread.layout(10, 3) == [4, 3, 3]
    assert spread.layout(3, 1) == [3]
    assert sum(spread.layout(10000, 2000)) == 10000
    for partitions, topics in ((3, 5), (0, 1), (5, 0)):
        with pytest.raises(ValueError):
            spread.layout(partitions, topics)


def test_a_layout_names_its_topics_so_its_regex_takes_them_and_no_other_layouts():
    import re
    big, small = spread.Layout(1000, 200), spread.Layout(3, 1)
    assert len(big.tps()) == 1000 and len(small.tps()) == 3
    assert all(re.fullmatch(big.regex, t) for t in big.topics)
    assert not any(re.fullmatch(big.regex, t) for t in small.topics)
    assert not any(re.fullmatch(small.regex, t) for t in big.topics)
    assert {tp.topic for tp in big.tps("d1_")} == {"d1_" + t for t in big.topics}


def test_the_partitions_options_default_and_refuse_what_cannot_be_laid_out():
    args = bench.parse_args(["--partitions", "1000"])
    assert (args.mode, args.topics, args.records_small) == ("partitions", 200, 50000)
    assert (args.first_timeout, args.idle_timeout) == (600, 300)
    args = bench.parse_args(["--partitions", "1000", "--topics", "10",
                             "--against-partitions", "3", "--records-small", "7"])
    assert (args.topics, args.against_partitions, args.records_small) == (10, 3, 7)
    assert bench.parse_args(["--partitions", "3"]).topics == 1
    assert not bench.parse_args(["--partitions", "3"]).destination_topics_ahead
    assert bench.parse_args(["--partitions", "3", "--destination-topics-ahead"]) \
        .destination_topics_ahead
    plain = bench.parse_args([])
    assert (plain.mode, plain.records_small, plain.partitions) == ("e2e", 200000, None)
    assert (plain.first_timeout, plain.idle_timeout) == (60, 35)
    for bad in (["--partitions", "3", "--topics", "5"], ["--topics", "5"],
                ["--against-partitions", "3"], ["--partitions", "0"],
                ["--destination-topics-ahead"],
                ["--partitions", "10", "--mode", "sender"], ["--partitions", "10", "--live"],
                ["--partitions", "10", "--against-partitions", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_percentiles_are_nearest_rank():
    values = list(range(1, 201))
    assert spread.percentile(values, 50) == 100
    assert spread.percentile(values, 99) == 198
    assert spread.percentile([7.0], 99) == 7.0
    assert spread.percentile([], 50) is None
    # (the warm-up's records, one a partition before the timing, are no lone record)
    summary = spread.lone_summary({b"a": 1.0, b"b": 2.0, b"c": 3.0},
                                  {b"warm-0": 0.5, b"a": 1.1, b"b": 2.3}, 3)
    assert (summary["sent"], summary["arrived"]) == (3, 2)
    assert summary["p50_ms"] == pytest.approx(100) and summary["p99_ms"] == pytest.approx(300)


def test_idle_share_is_every_process_summed_over_the_window():
    before = {"per_process": {"supervisor": 1.0, "sender/packer-0": 2.0}}
    after = {"per_process": {"supervisor": 1.1, "sender/packer-0": 2.2, "receiver/x-0": 0.3}}
    total, per = spread.core_share(before, after, 2.0)
    assert total == pytest.approx(0.3)
    assert per["receiver/x-0"] == pytest.approx(0.15)


def test_ratios_are_taken_within_a_repeat_and_not_from_runs_that_lost_records():
    def row(run, system, partitions, seconds, missing=0):
        return {"run": run, "baseline": system == "relay", "system": system,
                "partitions": partitions, "received": 1000 - missing, "seconds": seconds,
                "missing": missing, "value_bytes": 0}
    rows = [row(1, "relay", 1000, 10), row(1, "diode", 1000, 20), row(1, "diode", 3, 5),
            row(2, "relay", 1000, 10), row(2, "diode", 1000, 5, missing=1), row(2, "diode", 3, 5)]
    runs = spread.summarise(rows, 1000, 3)["runs"]
    assert runs[0]["against_relay"] == pytest.approx(0.5)
    assert runs[0]["against_partitions"] == pytest.approx(0.25)
    assert runs[1]["against_relay"] is None and runs[1]["against_partitions"] is None


def test_the_writer_and_startup_modes_take_the_partitions_and_refuse_what_they_do_not_use():
    writer = bench.parse_args(["--mode", "writer"])
    assert (writer.mode, writer.partitions, writer.busy) == ("writer", None, 10)
    writer = bench.parse_args(["--mode", "writer", "--partitions", "500", "--busy", "3"])
    assert (writer.partitions, writer.busy) == (500, 3)
    start = bench.parse_args(["--mode", "startup"])
    assert (start.partitions, start.topics, start.startup_skip) == (10000, 2000, [])
    start = bench.parse_args(["--mode", "startup", "--partitions", "1000", "--topics", "10",
                              "--startup-skip", "watcher,sync"])
    assert (start.partitions, start.topics, start.startup_skip) == (1000, 10,
                                                                     ["watcher", "sync"])
    for bad in (["--mode", "writer", "--topics", "5"], ["--mode", "writer", "--busy", "20",
                                                        "--partitions", "10"],
                ["--mode", "writer", "--partitions", "0"],
                ["--mode", "writer", "--against-partitions", "3"],
                ["--mode", "startup", "--partitions", "10", "--topics", "20"],
                ["--mode", "startup", "--startup-skip", "watcher,nothing"],
                ["--mode", "partitions"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_the_writer_mode_measures_each_call_on_the_writer_stage_as_it_is(monkeypatch):
    """The writer mode builds a real kafka_writer stage in this process: run on a few
    partitions (each call once), it gives a figure for every call, by partition count."""
    from types import SimpleNamespace

    from benchlib import writer_cost
    calls = []

    def once(fn, seconds=1.0):
        fn()
        calls.append(fn)
        return 0.001
    monkeypatch.setattr(writer_cost, "per_call", once)
    result = writer_cost.run(SimpleNamespace(args=SimpleNamespace(partitions=20, busy=2)))
    assert [r["partitions"] for r in result["rows"]] == [20]
    assert set(result["rows"][0]["ms"]) == {"expire", "idle turn", "metrics", "checkpoint"}
    assert len(calls) == 4


def test_the_meter_asks_offsets_in_batches_and_keeps_each_partitions_answer_or_error():
    class Answer:
        def __init__(self, offset):
            self.offset = offset

    class Admin:  # answers as AdminClient.list_offsets does: a future per partition
        def __init__(self):
            self.requests = []

        def list_offsets(self, specs, request_timeout):
            self.requests.append(len(specs))
            out = {}
            for tp in specs:
                f = Future()
                if tp.partition == 3:
                    f.set_exception(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
                else:
                    f.set_result(Answer(tp.partition * 10))
                out[tp] = f
            return out

    admin = Admin()
    tps = [TopicPartition(f"t{i // 5}", i % 5) for i in range(2500)]
    got = meter.list_offsets(admin, {tp: OffsetSpec.latest() for tp in tps})
    assert admin.requests == [1000, 1000, 500]
    assert list(got) == tps
    assert all(isinstance(got[tp], KafkaException) for tp in tps if tp.partition == 3)
    assert all(got[tp] == tp.partition * 10 for tp in tps if tp.partition != 3)
