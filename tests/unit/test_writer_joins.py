"""The kafka_writer produces a partition's consecutive runs joined (diode.writer.destination:
Destination.add joins a run to the last of its chain waiting whole): each partition's records in
their order, and nothing joined across what must stay apart."""

from diode.link import runs
from diode.link.records import RESEND, Record
from diode.writer import destination
from tests.unit.writer_fakes import LOG, FakeProducer, metrics, settings


def run(partition: int, first: int, n: int, prev: int | None = None, headers=()):
    recs = [Record("t", partition, o, 1000 + o, 1, b"k%d" % o, b"v%d" % o, headers,
                   (first - 1 if prev is None else prev) if o == first else o - 1)
            for o in range(first, first + n)]
    return runs.Run.decode(runs.from_records(recs, 2))


def backlog_of(*added, room: int = 10**9) -> destination.Destination:
    """A destination whose topic is known, `added` (runs, or (run, extra)) added in turn."""
    d = destination.Destination(settings(), metrics(), LOG,
                                lambda **config: FakeProducer(room, **config), lambda t: t,
                                {"t": 2}, lambda *a: None, ask_topic=lambda *a: None)
    d.dest_partitions["t"] = 2
    for one in added:
        d.add(*one) if isinstance(one, tuple) else d.add(one)
    return d


def order(d) -> list:
    return [(e.whole().partition, list(e.run.offsets)) for e in d.backlog]


def test_each_partitions_consecutive_runs_become_one_in_order():
    d = backlog_of(run(0, 0, 3), run(1, 0, 2), run(0, 3, 2), run(1, 2, 2), run(0, 5, 1))
    assert order(d) == [(0, [0, 1, 2, 3, 4, 5]), (1, [0, 1, 2, 3])]
    assert d.backlog_records == 10


def test_what_must_stay_apart_does():
    gap = run(0, 10, 2, prev=9)            # follows 8, 9: lost, reported missing
    resent = run(0, 20, 1, prev=RESEND)
    with_headers = run(0, 12, 1, headers=(("h", b"x"),))
    d = backlog_of(run(0, 5, 3), gap, run(1, 0, 3), (resent, (("ticket", b"1"),)),
                   run(0, 21, 1, prev=RESEND), with_headers)
    assert order(d) == [(0, [5, 6, 7]), (0, [10, 11]), (1, [0, 1, 2]), (0, [20]), (0, [21]),
                        (0, [12])]


def test_a_run_partly_produced_takes_no_more_and_its_successor_starts_another():
    d = backlog_of(run(1, 0, 3), room=1)
    d.produce_backlog()  # (a full queue: 1 of 3 produced)
    assert d.queue_full and d.backlog[0].done == 1
    d.add(run(1, 3, 2))
    assert order(d) == [(1, [0, 1, 2]), (1, [3, 4])]
    d.producer.acknowledge()
    d.producer.room = 10**9
    d.produce_backlog()
    assert [m.key() for m in d.producer.taken] == [b"k%d" % o for o in range(5)]
    assert not d.backlog and not d.tails  # (nothing kept of what was produced)


def test_a_join_stops_at_its_size():
    n = destination.MAX_JOINED_RECORDS // 2 + 1
    d = backlog_of(run(0, 0, n), run(0, n, n))
    assert [len(e.whole()) for e in d.backlog] == [n, n]
