"""The kafka_writer produces a partition's consecutive runs joined
(diode.writer.destination.joined): each partition's records in their order, and nothing joined
across what must stay apart."""

from collections import deque

from diode.link import runs
from diode.link.records import RESEND, Record
from diode.writer import destination
from diode.writer.destination import Entry


def run(partition: int, first: int, n: int, prev: int | None = None, headers=()):
    recs = [Record("t", partition, o, 1000 + o, 1, b"k%d" % o, b"v%d" % o, headers,
                   (first - 1 if prev is None else prev) if o == first else o - 1)
            for o in range(first, first + n)]
    return runs.Run.decode(runs.from_records(recs, 2))


def order(backlog) -> list:
    return [(e.run.partition, list(e.run.offsets)) for e in backlog]


def test_each_partitions_consecutive_runs_become_one_in_order():
    backlog = deque([Entry(run(0, 0, 3)), Entry(run(1, 0, 2)), Entry(run(0, 3, 2)),
                     Entry(run(1, 2, 2)), Entry(run(0, 5, 1))])
    assert order(destination.joined(backlog)) == [(0, [0, 1, 2, 3, 4, 5]), (1, [0, 1, 2, 3])]


def test_what_must_stay_apart_does():
    gap = run(0, 10, 2, prev=9)            # follows 8, 9: lost, reported missing
    started = Entry(run(1, 0, 3), 1)       # partly produced already
    resent = run(0, 20, 1, prev=RESEND)
    with_headers = run(0, 12, 1, headers=(("h", b"x"),))
    backlog = deque([Entry(run(0, 5, 3)), Entry(gap), started, Entry(run(1, 3, 2)),
                     Entry(resent), Entry(with_headers)])
    got = destination.joined(backlog)
    assert order(got) == [(0, [5, 6, 7]), (0, [10, 11]), (1, [0, 1, 2]), (1, [3, 4]),
                          (0, [20]), (0, [12])]
    assert got[2] is started


def test_a_join_stops_at_its_size():
    n = destination.MAX_JOINED_RECORDS // 2 + 1
    backlog = deque([Entry(run(0, 0, n)), Entry(run(0, n, n))])
    assert [len(e.run) for e in destination.joined(backlog)] == [n, n]
