"""A kafka_reader's memory across its restarts written off its loop (diode.kafka.lineage.Keeper):
the loop hands a picture and goes on while the file is written, and a restart reads back what
the reader knew when it took the picture, as it read a file written in the loop before."""

import threading

from diode.kafka import lineage
from diode.runtime import files

OLD, NEW = bytes(range(16)), bytes(range(1, 17))
# What main's code wrote (lineage.save before the Keeper) of the memory in `known()`
MAINS_FILE = ('{"version":1,"topology":"alpha","readers":2,"cluster":"c1","topics":{"t":'
              '"AAECAwQFBgcICQoLDA0ODw"},"partitions":[["t",0,5,9,7,5,20],["t",1,null,null,-1,'
              '-2,-1]],"retired":[[["u",0,"AQIDBAUGBwgJCgsMDQ4PEA",0,3,4,true],12.5]]}')


def known() -> dict:
    return {"cluster": "c1", "topics": {"t": OLD},
            "partitions": [["t", 0, 5, 9, 7, 5, 20], ["t", 1, None, None, -1, -2, -1]],
            "retired": [(["u", 0, NEW, 0, 3, 4, True], 12.5)]}


def a_reader(partitions: int):
    """A lineage and a reader's tables over `partitions` partitions of 5 a topic, one departed
    and one retired claim."""
    line = lineage.Lineage()
    line.cluster = "c1"
    assigned, chain_start, last_read, positions = {}, {}, {}, {}
    for i in range(partitions):
        tp = (f"topic-{i // 5}", i % 5)
        line.incarnations[tp[0]] = OLD
        line.ends[tp] = 100 + i
        assigned[tp] = lineage.OFFSET_BEGINNING if i % 2 else 7
        if i % 3:
            chain_start[tp], last_read[tp], positions[tp] = 7, 50 + i, 40 + i
    line.depart(("gone", 0), 3, 9, 8, 0, [])
    line.remembered["gone"] = NEW
    line.recreate("gone", NEW)
    line.depart(("moved", 1), None, None, -1, lineage.OFFSET_BEGINNING, [])
    line.remembered["moved"] = NEW
    return line, assigned, chain_start, last_read, positions


def test_a_picture_is_written_off_the_loop_and_read_back_as_a_reader_knew_it_then(
        tmp_path, monkeypatch):
    """The loop hands its picture and goes on while the disk is slow (a file of 10 000
    partitions took the loop seconds on a loaded machine, and 20 s without a step has the
    supervisor kill it); what a restart loads is what the reader knew when it handed it (its
    tables changed afterwards are not in it), the same as the loop's own write of it gave."""
    where = lineage.memory_path(str(tmp_path), 0)
    line, assigned, chain_start, last_read, positions = a_reader(2000)
    reading = [[t, p, chain_start.get((t, p)), last_read.get((t, p)),
                lineage.sent((t, p), positions, chain_start), at]
               for (t, p), at in assigned.items()]
    lineage.save(str(tmp_path / "state" / "then.json"), "alpha", 1, line.memory(reading))

    writing, disk = threading.Event(), threading.Event()
    replace = files.replace

    def slow_disk(path, data, **kwargs):
        writing.set()
        assert disk.wait(10)
        replace(path, data, **kwargs)
    monkeypatch.setattr(files, "replace", slow_disk)
    keeper = lineage.Keeper(where, "alpha", 1)
    try:
        keeper.keep(line.picture(assigned, chain_start, last_read, positions))
        assert writing.wait(10)  # (the keeper writes; the loop has gone on meanwhile)
        assigned[("late", 0)] = 0
        line.ends[("topic-0", 0)] = 10**6
        last_read[("topic-0", 1)] = 10**6
        disk.set()
    finally:
        keeper.close()
    back = lineage.load(where, "alpha", 1)
    then = lineage.load(str(tmp_path / "state" / "then.json"), "alpha", 1)
    retired = [(c, round(age)) for c, age in back.pop("retired")]
    assert retired and retired == [(c, round(age)) for c, age in then.pop("retired")]
    assert back == then
    assert len(back["partitions"]) == 2001


def test_pictures_handed_while_one_is_written_give_way_to_the_last_written_at_close(
        tmp_path, monkeypatch):
    """A slow disk never queues pictures up (each the size of the reader's tables): the
    last one handed replaces those not written yet, and a reader that closes has it written
    (a restart after a clean stop knows everything it knew)."""
    where = lineage.memory_path(str(tmp_path), 0)
    line, assigned, chain_start, last_read, positions = a_reader(10)
    writing, disk, written = threading.Event(), threading.Event(), []
    replace = files.replace

    def slow_disk(path, data, **kwargs):
        writing.set()
        assert disk.wait(10)
        written.append(data)
        replace(path, data, **kwargs)
    monkeypatch.setattr(files, "replace", slow_disk)
    keeper = lineage.Keeper(where, "alpha", 1)
    keeper.keep(line.picture(assigned, chain_start, last_read, positions))
    assert writing.wait(10)
    for read in (60, 70, 80):
        last_read[("topic-0", 1)] = read
        keeper.keep(line.picture(assigned, chain_start, last_read, positions))
    disk.set()
    keeper.close()
    assert len(written) == 2
    back = lineage.load(where, "alpha", 1)
    assert ["topic-0", 1, 7, 80, 40, lineage.OFFSET_BEGINNING, 100] in back["partitions"]


def test_a_memory_is_written_as_mains_code_wrote_it_and_mains_file_loads(tmp_path):
    """The file is the same JSON, byte for byte, though its partitions are encoded a slice
    at a time; a file written by the code before loads as it did."""
    where = str(tmp_path / "state" / "x.json")
    lineage.save(where, "alpha", 2, known())
    assert open(where).read() == MAINS_FILE
    line, *tables = a_reader(2 * lineage.MEMORY_SLICE + 7)
    lineage.save(where, "alpha", 2, lineage.memory(line.picture(*tables)))
    data = files.read_json(where)
    assert open(where).read() == files.json.dumps(data, separators=(",", ":"))
    (tmp_path / "state" / "x.json").write_text(MAINS_FILE)
    back = lineage.load(where, "alpha", 2)
    assert back["topics"] == {"t": OLD} and back["retired"] == [(["u", 0, NEW, 0, 3, 4, True],
                                                                 12.5)]
    assert back["partitions"] == known()["partitions"]
