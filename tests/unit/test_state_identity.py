"""State that describes a flow says which: the receiver's state directory names its topology and
link (diode.runtime.statedir), a reader's memory its topology and reader count
(diode.kafka.lineage); state of another is refused or reset with a report, never used."""

import fcntl
import logging
import os
from types import SimpleNamespace

import pytest

from diode.errors import DiodeError
from diode.kafka import lineage
from diode.runtime import checkpoints, statedir

OLD, NEW = b"\x01" * 16, b"\x02" * 16
log = logging.getLogger("test")


def topology(name="alpha", port=3456):
    return SimpleNamespace(name=name, link=SimpleNamespace(port=port))


def test_a_new_directory_is_claimed_and_the_same_flow_uses_it_again(tmp_path):
    d = str(tmp_path / "journal")
    statedir.claim(topology(), d, reset=False, log=log)
    assert statedir.read_identity(d) == {"topology": "alpha", "link": "udp port 3456"}
    statedir.claim(topology(), d, reset=False, log=log)  # (a restart)


@pytest.mark.parametrize("other", [topology("beta"), topology(port=4000)])
def test_another_flows_directory_is_refused_naming_it_and_nothing_is_touched(tmp_path, other):
    d = str(tmp_path)
    statedir.claim(topology(), d, reset=False, log=log)
    checkpoints.save(d, 0, 0, [["t", 0, {"frontier": 9, "incarnation": "AQEBAQEBAQEBAQEBAQEBAQ",
                                         "current": True}]], 1, 1, sync=False)
    before = {n: os.path.getmtime(os.path.join(d, n)) for n in os.listdir(d)}
    with pytest.raises(DiodeError) as exc:
        statedir.claim(other, d, reset=False, log=log)
    said = str(exc.value)
    assert d in said and "'alpha'" in said and "--reset-state" in said
    assert "t[0]: topic id AQEBAQEBAQEBAQEBAQEBAQ up to offset 9 (current)" in said
    assert {n: os.path.getmtime(os.path.join(d, n)) for n in os.listdir(d)} == before


def test_reset_state_says_what_it_discards_then_starts_anew(tmp_path, caplog):
    d = str(tmp_path)
    statedir.claim(topology(), d, reset=False, log=log)
    checkpoints.save(d, 0, 0, [["t", 0, {"frontier": 9, "incarnation": "AQEBAQEBAQEBAQEBAQEBAQ",
                                         "current": True}]], 1, 1, sync=False)
    (tmp_path / "00000000000000000000.journal").write_bytes(b"x" * 100)
    (tmp_path / "operator-notes.txt").write_text("not ours")
    with caplog.at_level(logging.WARNING):
        statedir.claim(topology("beta"), d, reset=True, log=log)
    said = caplog.text
    assert "discarding the receiver state" in said and "'alpha'" in said and \
        "100 bytes" in said and "t[0]" in said
    assert sorted(os.listdir(d)) == ["identity.json", "operator-notes.txt"]
    assert statedir.read_identity(d)["topology"] == "beta"


def test_reset_state_is_refused_while_a_receiver_holds_the_directory(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (as a running journal does)
        with pytest.raises(DiodeError, match="a receiver is running"):
            statedir.discard(str(tmp_path), log)
    finally:
        os.close(fd)


def test_a_reader_remembers_its_sources_for_the_same_topology_only(tmp_path):
    where = lineage.memory_path(str(tmp_path), 0)
    claim = ["t", 1, OLD, 0, 41, 99, True]
    memory = {"cluster": "cluster-1", "topics": {"t": NEW},
              "partitions": [["t", 0, 0, 10, 9, -2, 20]], "retired": [(claim, 5.0)]}
    lineage.save(where, "alpha", 2, memory)
    back = lineage.load(where, "alpha", 2)
    assert back["topics"] == {"t": NEW} and back["cluster"] == "cluster-1"
    assert back["partitions"] == [["t", 0, 0, 10, 9, -2, 20]]
    assert back["retired"] == [(claim, 5.0)]
    assert lineage.load(where, "beta", 2) is None    # another topology's
    assert lineage.load(where, "alpha", 3) is None   # another reader count: others' partitions
    (tmp_path / "state" / "sender-kafka_reader-0.json").write_text("{broken")
    assert lineage.load(where, "alpha", 2) is None
    assert lineage.load(lineage.memory_path(str(tmp_path), 7), "alpha", 2) is None
