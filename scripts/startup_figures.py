"""Startup figures at many partitions (issue 36): how long the sender's PartitionWatcher takes
to find a source of TOPICS × PARTITIONS and their identities, how long the receiver's Preparer
takes to create (and learn the counts of) as many destination topics, asked at once as a
writer asks them when the first records of every topic come together, and how long the
MetadataSync takes to make the destination follow the source's metadata of as many topics.
Two embedded Apache Kafka brokers (or Tansu with --broker tansu) of its own; not a test.

    .venv/bin/python scripts/startup_figures.py --topics 2000 --partitions 5
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diode.kafka.brokers import free_port, make_broker, start_all
from diode.kafka.clients import TopicSelector
from diode.kafka.metadata import MetadataWatcher
from diode.kafka.metasync import MetadataSync
from diode.kafka.preparer import Preparer, TopicAnswer
from diode.kafka.refresh import PartitionWatcher


def make_source(bootstrap: str, topics: list, partitions: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    for i in range(0, len(topics), 500):
        futures = admin.create_topics([NewTopic(t, partitions) for t in topics[i:i + 500]],
                                      operation_timeout=60)
        for f in futures.values():
            f.result(90)
    return time.monotonic() - started


def watch(bootstrap: str, topics: list, partitions: int) -> tuple:
    selector = TopicSelector([], [r"t\d+"])
    watcher = PartitionWatcher({"bootstrap.servers": bootstrap, "group.id": "figures"},
                               selector.owned, 600.0, 600.0, state=600.0)
    started = time.monotonic()
    watcher.start()
    try:
        while True:
            for found in watcher.take():
                if found.error is None and found.counts:
                    return (time.monotonic() - started, len(found.new),
                            len(found.incarnations), len(found.ends), len(found.starts))
                print("  watcher:", found.error)
            time.sleep(0.01)
    finally:
        watcher.close()


def metadata_look(bootstrap: str) -> tuple:
    selector = TopicSelector([], [r"t\d+"])
    watcher = MetadataWatcher({"bootstrap.servers": bootstrap}, selector.matches,
                              ["retention.ms", "cleanup.policy"], [], 600.0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    look = watcher.look(admin)
    if look.error:
        print("  metadata watcher:", look.error)
    return time.monotonic() - started, look


def prepare(bootstrap: str, topics: list, partitions: int) -> tuple:
    preparer = Preparer({"bootstrap.servers": bootstrap}).start()
    started = time.monotonic()
    try:
        for t in topics:
            preparer.topic(t, partitions)
        answers = []
        while len(answers) < len(topics):
            answers += [a for a in preparer.take() if isinstance(a, TopicAnswer)]
            time.sleep(0.01)
        took = time.monotonic() - started
    finally:
        preparer.close()
    good = sum(1 for a in answers if a.partitions == partitions)
    errors = {a.error.str() for a in answers if a.error is not None}
    if errors:
        print("  preparer errors:", "; ".join(sorted(errors)[:3]))
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
            reports += s.take()
            time.sleep(0.01)
        took = time.monotonic() - started
    finally:
        s.close()
    created = sum(1 for rep in reports for reason, _ in rep.done if reason == "created")
    errors = [rep.error for rep in reports if rep.error]
    return took, created, errors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=2000)
    p.add_argument("--partitions", type=int, default=5)
    p.add_argument("--broker", default="kafka", choices=("kafka", "tansu"))
    p.add_argument("--skip", nargs="*", default=[], choices=("watcher", "preparer", "sync"),
                   help="figures not taken")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="startup-figures-"))
    brokers = [make_broker(args.broker, name, f"127.0.0.1:{free_port()}",
                           str(work / f"{name}.log"))
               for name in ("source", "destination")]
    start_all(brokers, timeout=300)  # (a loaded machine starts a JVM slowly)
    src, dst = (b.bootstrap for b in brokers)
    topics = [f"t{i:05d}" for i in range(args.topics)]
    n = args.topics * args.partitions
    try:
        print(f"{args.broker}: {args.topics} topics x {args.partitions} partitions ({n}); "
              f"pid {os.getpid()}")
        print(f"source topics created in {make_source(src, topics, args.partitions):.1f} s")
        if "watcher" not in args.skip:
            took, new, ids, ends, starts = watch(src, topics, args.partitions)
            print(f"watcher: first look {took:.2f} s ({new} partitions with their committed "
                  f"offsets, {ids} identities, {ends} ends, {starts} starts)", flush=True)
        took, look = metadata_look(src)
        print(f"metadata watcher: a look {took:.2f} s ({len(look.topics)} topics)", flush=True)
        if "preparer" not in args.skip:
            dest = [f"r{t}" for t in topics]
            took, good, created = prepare(dst, dest, args.partitions)
            print(f"preparer: {len(dest)} destination topics answered in {took:.2f} s "
                  f"({created} created, {good} with {args.partitions} partitions)", flush=True)
            took, good, _ = prepare(dst, dest, args.partitions)
            print(f"preparer: the same {len(dest)} topics asked again (they exist) in "
                  f"{took:.2f} s ({good} answered with {args.partitions} partitions)",
                  flush=True)
        if "sync" not in args.skip:
            took, created, errors = sync(dst, look)
            print(f"metadata sync: {len(look.topics)} topics followed in {took:.2f} s "
                  f"({created} created, {len(errors)} errors"
                  f"{': ' + errors[0] if errors else ''})", flush=True)
    finally:
        for b in brokers:
            b.stop()


if __name__ == "__main__":
    main()
