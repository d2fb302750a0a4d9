"""The kafka_writer produces a partition's consecutive runs joined (stages.kafka_writer.joined):
each partition's records in their order, and nothing joined across what must stay apart."""

from collections import deque

from diode.link import runs
from diode.link.records import RESEND, Record
from stages import kafka_writer


def run(partition: int, first: int, n: int, prev: int | None = None, headers=()):
    recs = [Record("t", partition, o, 1000 + o, 1, b"k%d" % o, b"v%d" % o, headers,
                   (first - 1 if prev is None else prev) if o == first else o - 1)
            for o in range(first, first + n)]
    return runs.Run.decode(runs.from_records(recs, 2))


def order(backlog) -> list:
    return [(e[0].partition, list(e[0].offsets)) for e in backlog]


def test_each_partitions_consecutive_runs_become_one_in_order():
    backlog = deque([[run(0, 0, 3), 0, None, ()], [run(1, 0, 2), 0, None, ()],
                     [run(0, 3, 2), 0, None, ()], [run(1, 2, 2), 0, None, ()],
                     [run(0, 5, 1), 0, None, ()]])
    assert order(kafka_writer.joined(backlog)) == [(0, [0, 1, 2, 3, 4, 5]), (1, [0, 1, 2, 3])]


def test_what_must_stay_apart_does():
    gap = run(0, 10, 2, prev=9)            # follows 8, 9: lost, reported missing
    started = [run(1, 0, 3), 1, None, ()]  # partly produced already
    resent = run(0, 20, 1, prev=RESEND)
    with_headers = run(0, 12, 1, headers=(("h", b"x"),))
    backlog = deque([[run(0, 5, 3), 0, None, ()], [gap, 0, None, ()], started,
                     [run(1, 3, 2), 0, None, ()], [resent, 0, None, ()],
                     [with_headers, 0, None, ()]])
    got = kafka_writer.joined(backlog)
    assert order(got) == [(0, [5, 6, 7]), (0, [10, 11]), (1, [0, 1, 2]), (1, [3, 4]),
                          (0, [20]), (0, [12])]
    assert got[2] is started


def test_a_join_stops_at_its_size():
    n = kafka_writer.MAX_JOINED_RECORDS // 2 + 1
    backlog = deque([[run(0, 0, n), 0, None, ()], [run(0, n, n), 0, None, ()]])
    assert [len(e[0]) for e in kafka_writer.joined(backlog)] == [n, n]
