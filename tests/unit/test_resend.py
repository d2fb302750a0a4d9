"""`diode resend`'s checks of a manifest (diode.resend), which need no cluster: a manifest naming
a topic the sender does not replicate, or a range wider than its ticket, is refused whole before
anything is read; ranges of another incarnation, of a partition the source lacks, or below its
log start are not sent. The run against a broker is tests/integration/test_resend_incarnation.py.
"""

import json

import pytest

from diode import resend, ticket_command
from diode.accounting import tickets
from diode.cli import build_parser
from diode.errors import DiodeError
from diode.kafka import identity
from diode.runtime import topology as topo
from tests.conftest import write_topology

OLD, NEW = "AAAAAAAAAAAAAAAAAAAAAQ", "AAAAAAAAAAAAAAAAAAAAAg"


def sender(tmp_path, **settings):
    """A topology whose source cluster is not there (127.0.0.1:1): a check that asked it would
    fail with "cannot read the source topics' ids", not with the refusal."""
    return write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          sender={"topics": ["src"], "topics.regex": ["metrics-[a-z]+"],
                                  **settings})


def entry(topic, ranges, partition=0, topic_id=NEW, tickets_=None):
    return {"topic": topic, "partition": partition, "topicId": topic_id, "ranges": ranges,
            **({"tickets": tickets_} if tickets_ is not None else {})}


def run(tmp_path, topology, manifest, *extra):
    """`diode resend` of `manifest`, signed with the topology's key, as the command runs it."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(ticket_command.signed(topo.load(str(topology)), manifest)))
    args = build_parser().parse_args(["resend", str(path), "--topology", str(topology),
                                      *extra])
    return args.func(args)


@pytest.mark.parametrize("dry", [(), ("--dry-run",)])
def test_a_manifest_naming_a_topic_the_sender_does_not_replicate_is_refused_whole(tmp_path,
                                                                                   dry):
    """Signed with the link's key, which the low side holds: the signature says who made it,
    not that the high side may send what it asks. Every topic that is not replicated is named
    with the reason, and nothing is read (the source cluster is never asked), dry run or not."""
    topology = sender(tmp_path)
    manifest = {"version": 1, "missing": [
        entry("src", [[0, 9]]), entry("metrics-cpu", [[0, 9]]),   # by name; by regex
        entry("secret", [[0, 9]]), entry("metrics-cpu-2", [[0, 9]]),
        entry("diode-dead-letter", [[0, 9]]), entry("__consumer_offsets", [[0, 9]])]}
    with pytest.raises(DiodeError) as refused:
        run(tmp_path, topology, manifest, *dry)
    said = str(refused.value)
    assert said.startswith(f"{tmp_path / 'manifest.json'} is refused, nothing resent:\n")
    assert said.splitlines()[1:] == [
        "  __consumer_offsets is not a topic the sender replicates: an internal topic, not "
        "named in sender.topics (a pattern never selects one)",
        "  diode-dead-letter is not a topic the sender replicates: sender.dead.letter.topic: "
        "the sender's own dead letters, never replicated",
        "  metrics-cpu-2 is not a topic the sender replicates: not in sender.topics, and no "
        "pattern of sender.topics.regex matches it",
        "  secret is not a topic the sender replicates: not in sender.topics, and no pattern "
        "of sender.topics.regex matches it"]


def test_the_topics_a_manifest_may_name_are_those_the_readers_replicate(tmp_path):
    """The same choice as the readers' (diode.kafka.clients.replicated): by name, by regex,
    the registry's topic with sender.schemas, an internal topic only by name."""
    t = topo.load(str(sender(tmp_path, topics=["src", "__internal"], schemas=True)))
    named = {"missing": [entry(x, [[0, 1]]) for x in
                         ("src", "metrics-cpu", "_schemas", "__internal")]}
    assert resend.refusals(t, named, resend.parse(named)) == []
    t = topo.load(str(sender(tmp_path, topics=[], **{"topics.regex": [".*"]})))
    assert resend.refusals(t, named, resend.parse(named)) == [
        "__internal is not a topic the sender replicates: an internal topic, not named in "
        "sender.topics (a pattern never selects one)"]


def test_a_range_wider_than_its_ticket_is_refused_whole(tmp_path):
    """Widened and signed again with the link's key, the ticket's id left as it was: refused,
    naming the range, before anything is read."""
    topology = sender(tmp_path)
    ids = [tickets.ticket_id(NEW, "src", 0, 10, 19), tickets.ticket_id(NEW, "src", 0, 40, 40)]
    manifest = {"version": 2, "missing": [entry("src", [[10, 19], [0, 40]], tickets_=ids)]}
    with pytest.raises(DiodeError) as refused:
        run(tmp_path, topology, manifest, "--dry-run")
    assert str(refused.value).splitlines()[1:] == [
        f"  src[0] 0..40 is not the range of its ticket {ids[1]} (wider than the range "
        "reported missing, or another)"]


def test_ranges_that_are_not_offsets_are_not_a_manifest():
    for bad in ([[5, 4]], [[-1, 3]], [[1]]):
        with pytest.raises((ValueError, TypeError)):
            resend.parse({"missing": [entry("src", bad)]})
    with pytest.raises(ValueError, match="tickets is not a list of ticket ids"):
        resend.parse({"missing": [entry("src", [[0, 1]], tickets_="abc")]})


def test_ranges_of_another_incarnation_or_partition_or_below_the_log_start_are_not_sent():
    m = {"missing": [entry("src", [[0, 9], [20, 29], [50, 59]], 0),
                     entry("src", [[0, 9]], 1, topic_id=OLD),       # recreated since
                     entry("src", [[0, 9]], 7),                     # no partition 7
                     entry("gone", [[0, 9]]),                       # no such topic now
                     {"topic": "old", "partition": 0, "ranges": [[0, 9]]}]}  # no id
    kept, refused, unchecked = resend.by_incarnation(
        resend.parse(m), {"src": identity.parse(NEW)})
    assert refused == [
        f"gone partition(s) 0: the manifest names topic id {NEW}, and the source cluster has "
        "no topic gone now; not resent",
        f"src partition(s) 1: the manifest names topic id {OLD}, the source cluster's src is "
        f"topic id {NEW}: another incarnation, whose offsets hold other records; not resent"]
    assert unchecked == {"old"}
    found, absent = resend.spans(kept, {("src", 0): 25, ("old", 0): 0})
    assert absent == ["src[7]: the source cluster has no such partition; not resent"]
    # 0..9 all below the log start 25: expired; 20..29 sent from 25; 50..59 whole
    assert resend.to_send(found) == {("src", 0): [[25, 29], [50, 59]], ("old", 0): [[0, 9]]}
    assert [s.expired for s in found] == [0, 10, 5, 0]
    assert resend.expired_lines(found) == [
        "src[0]: 2 range(s) reach below the source's log start 25: 15 offset(s) expired, not "
        "resent (they can never be)"]
