"""--mode startup --partitions N [--topics T]: how startup's parts scale with the partitions
(issue 36), each alone on two embedded brokers of --broker's kind (no launch): how long the
sender's PartitionWatcher takes to find a source of T topics holding N partitions and their
identities, how long the receiver's Preparer takes to create (and learn the counts of) as many
destination topics, asked at once as a writer asks them when the first records of every topic
come together (then asked again, existing), and how long the MetadataSync takes to make the
destination follow the source's metadata of as many topics. --startup-skip leaves parts out.
Not a test: figures.

    ./scripts/bench --mode startup --partitions 10000 --topics 2000
"""

import time
from types import SimpleNamespace

from confluent_kafka.admin import AdminClient

from diode.kafka.clients import TopicSelector
from diode.kafka.metadata import MetadataWatcher
from diode.kafka.metasync import MetadataSync
from diode.kafka.preparer import Preparer, TopicAnswer
from diode.kafka.refresh import PartitionWatcher

from .resources import check_interrupted, log
from .spread import create_topics, layout

PARTS = ("watcher", "preparer", "sync")
DEFAULT_PARTITIONS = 10000   # --mode startup without --partitions (2 000 topics of 5)


def make_source(bootstrap: str, topics: dict) -> float:
    """Seconds until every topic of `topics` is made and the broker answers for every
    partition (spread.create_topics): a look at partitions still being made (Apache Kafka
    makes 10 000 in minutes on this machine) would time the broker, not the watcher."""
    started = time.monotonic()
    create_topics(bootstrap, topics)
    return time.monotonic() - started


def watch(bootstrap: str) -> tuple:
    selector = TopicSelector([], [r"t\d+"])
    watcher = PartitionWatcher({"bootstrap.servers": bootstrap, "group.id": "figures"},
                               selector.owned, 600.0, 600.0, state=600.0)
    started = time.monotonic()
    watcher.start()
    try:
        while True:
            check_interrupted()
            for found in watcher.take():
                if found.error is None and found.counts:
                    return (time.monotonic() - started, len(found.new),
                            len(found.incarnations), len(found.ends), len(found.starts))
                log(f"startup: watcher: {found.error}")
            time.sleep(0.01)
    finally:
        watcher.close()


def metadata_look(bootstrap: str, keep: list) -> tuple:
    """(seconds, the look). Its admin client goes to `keep`: dropped here while a request the
    look stopped waiting for was still out, the client was destroyed by librdkafka's own thread
    when the answer came, which aborts the process ("calling rd_kafka_destroy() from librdkafka
    owned thread is prohibited": Apache Kafka, 10 000 partitions, the look timed out)."""
    selector = TopicSelector([], [r"t\d+"])
    watcher = MetadataWatcher({"bootstrap.servers": bootstrap}, selector.matches,
                              ["retention.ms", "cleanup.policy"], [], 600.0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    keep.append(admin)
    started = time.monotonic()
    look = watcher.look(admin)
    if look.error:
        log(f"startup: metadata watcher: {look.error}")
    return time.monotonic() - started, look


def prepare(bootstrap: str, topics: dict) -> tuple:
    """(seconds until every topic of `topics` (name -> partitions) is answered, how many with
    their partitions, how many created)."""
    preparer = Preparer({"bootstrap.servers": bootstrap}).start()
    started = time.monotonic()
    try:
        for t, n in topics.items():
            preparer.topic(t, n)
        answers = []
        while len(answers) < len(topics):
            check_interrupted()
            answers += [a for a in preparer.take() if isinstance(a, TopicAnswer)]
            time.sleep(0.01)
        took = time.monotonic() - started
    finally:
        preparer.close()
    good = sum(1 for a in answers if a.partitions == topics.get(a.topic))
    errors = {a.error.str() for a in answers if a.error is not None}
    if errors:
        log("startup: preparer errors: " + "; ".join(sorted(errors)[:3]))
    return took, good, sum(a.created for a in answers)


def sync(bootstrap: str, look) -> tuple:
    r = SimpleNamespace(topic_configs={}, sync_topic_configs=True, sync_topic_configs_allow=[],
                        sync_topic_configs_deny=[], sync_group_offsets=False,
                        group_checkpoints_topic="")
    s = MetadataSync({"bootstrap.servers": bootstrap}, r, lambda t: "m" + t).start()
    started = time.monotonic()
    try:
        s.hand(look.topics, {})
        reports = []
        while s.busy:
            check_interrupted()
            reports += s.take()
            time.sleep(0.01)
        took = time.monotonic() - started
    finally:
        s.close()
    created = sum(1 for rep in reports for reason, _ in rep.done if reason == "created")
    errors = [rep.error for rep in reports if rep.error]
    return took, created, errors


def run(b) -> dict:
    """The figures of the parts not skipped, each logged as it is taken."""
    args, res = b.args, b.res
    partitions = args.partitions
    counts = layout(partitions, args.topics)
    topics = {f"t{i:05d}": n for i, n in enumerate(counts)}
    src, dst = res.broker("source-startup", b.work), res.broker("dest-startup", b.work)
    out = {"partitions": partitions, "topics": len(topics), "broker": args.broker}
    keep: list = []  # clients kept until the brokers are stopped (metadata_look)
    try:
        out["source_created_seconds"] = make_source(src.bootstrap, topics)
        log(f"startup: {len(topics)} source topics ({partitions} partitions) created in "
            f"{out['source_created_seconds']:.1f} s")
        if "watcher" not in args.startup_skip:
            took, new, ids, ends, starts = watch(src.bootstrap)
            out["watcher"] = {"seconds": took, "partitions": new, "identities": ids,
                              "ends": ends, "starts": starts}
            log(f"startup: watcher: first look {took:.2f} s ({new} partitions with their "
                f"committed offsets, {ids} identities, {ends} ends, {starts} starts)")
        took, look = metadata_look(src.bootstrap, keep)
        out["metadata_look"] = {"seconds": took, "topics": len(look.topics)}
        log(f"startup: metadata watcher: a look {took:.2f} s ({len(look.topics)} topics)")
        if "preparer" not in args.startup_skip:
            dest = {"r" + t: n for t, n in topics.items()}
            took, good, created = prepare(dst.bootstrap, dest)
            again, good_again, _ = prepare(dst.bootstrap, dest)
            out["preparer"] = {"seconds": took, "created": created, "answered": good,
                               "again_seconds": again, "again_answered": good_again}
            log(f"startup: preparer: {len(dest)} destination topics answered in {took:.2f} s "
                f"({created} created, {good} with their partitions); asked again (they exist) "
                f"in {again:.2f} s ({good_again} answered with their partitions)")
        if "sync" not in args.startup_skip:
            took, created, errors = sync(dst.bootstrap, look)
            out["sync"] = {"seconds": took, "created": created, "errors": errors[:5]}
            log(f"startup: metadata sync: {len(look.topics)} topics followed in {took:.2f} s "
                f"({created} created, {len(errors)} errors"
                f"{': ' + errors[0] if errors else ''})")
    finally:
        res.stop_broker(src)
        res.stop_broker(dst)
    return out
