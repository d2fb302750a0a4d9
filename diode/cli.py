"""The `diode` command."""

import argparse
import dataclasses
import logging
import sys
import time

from diode.link import path as link_path
from diode.runtime import topology as topo
from diode.runtime import wiring
from diode.errors import DiodeError, TopologyError
from diode.runtime.worker import configure_logging


def cmd_check(args) -> int:
    """Validate the topology, then check on this host what a launch of the side(s) asked would
    need (diode.runtime.preflight): problems exit 2, warnings are printed and exit 0; then the
    plan of those sides."""
    from diode.runtime import preflight, statedir
    t = topo.load(args.file)
    sides = topo.SIDES if args.side == "both" else (args.side,)
    found = preflight.check(t, sides, args.timeout, args.verbose)
    fragmented = link_path.fragmentation(t.link) if "sender" in sides else None
    for warning in found.warnings + ([fragmented] if fragmented else []):
        print(f"warning: {warning}", file=sys.stderr)
    if found.problems:
        raise TopologyError(t.path, found.problems)
    run_dir = t.supervisor.run_dir or "<run dir>"
    print(f"topology {t.name} ({t.path}): valid; what a launch of the "
          f"{' and '.join(sides)} needs is here")
    size = (f"datagrams up to {t.link.datagram_size_bytes} bytes"
            f"{f' ({t.link.datagram_size_note})' if t.link.datagram_size_note else ''}")
    rate = f"{t.link.rate_mbps:g} Mbit/s{' (unpaced)' if not t.link.rate_mbps else ''}"
    if "sender" in sides:
        print(f"link: udp {t.link.host}:{t.link.port}"
              f"{f' (receiver binds {t.link.bind_address})' if 'receiver' in sides else ''}, "
              f"{size}, {rate}")
    else:
        print(f"link: udp {t.link.bind_address}:{t.link.port} bound, {size}, {rate}")
    print(f"security: {t.security.cipher}, compression: {t.compression}")
    r = t.receiver
    if "receiver" in sides:
        state_dir = t.resolve(r.journal_dir)
        print(f"receive journal: {state_dir} (up to {r.journal_max_bytes} bytes, "
              f"fsync {r.journal_fsync}, checkpoints every {r.checkpoint_interval_ms:g} ms)"
              if r.journal_enabled else "receive journal: off (a receiver restart loses what "
              "is in flight, reported missing)")
        if r.journal_enabled:
            held = statedir.held_state(state_dir)
            print(f"receiver state: {len(held)} source partition(s) in the checkpoints" +
                  "".join(f"\n  {line}" for line in held) if held else
                  "receiver state: none (a first start)")
    for b in t.brokers:
        if b.side in sides:
            print(f"embedded {b.kind} broker {b.name or b.listen}: {b.listen} ({b.side} side)")
    for note in found.notes:
        print(f"checked: {note}")
    print(f"{'process':<28} {'cpus':<10} endpoints")
    for spec in wiring.plan(t, sides):
        cpus = ",".join(map(str, spec.cpus)) or "all"
        binds, connects = wiring.describe(t, spec, run_dir)
        print(f"diode: {spec.name:<20} {cpus:<10} "
              + "; ".join([f"binds {e}" for e in binds] + [f"-> {e}" for e in connects]))
    if "receiver" in sides and t.link.rate_mbps and not args.no_measure:
        from diode.tune.capacity import check_rate, measure_receiver
        lines, warning = check_rate(t, measure_receiver(t, args.record_bytes))
        print("\n".join(lines))
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    return 0


def cmd_launch(args) -> int:
    from diode.runtime.supervisor import Supervisor
    t = topo.load(args.file)
    if args.broker_kind:
        t = dataclasses.replace(t, brokers=[dataclasses.replace(b, kind=args.broker_kind)
                                            for b in t.brokers])
    if args.reset_state:
        if args.side == "sender":
            raise DiodeError("--reset-state discards the receiver's state: launch the "
                             "receiver side with it")
        t = dataclasses.replace(t, receiver=dataclasses.replace(t.receiver, reset_state=True))
    sides = topo.SIDES if args.side == "both" else (args.side,)
    return Supervisor(t, sides, args.run_dir).run()


def cmd_resend(args) -> int:
    """Send exactly the manifest's ranges again through the sender pipeline, then exit. Offsets
    mean something only within one incarnation of a topic (diode.kafka.identity): an entry
    whose topicId names another than the source's current one is refused (its offsets hold
    other records now, or none); one without (a manifest of a diode older than topic ids) is
    sent unchecked. A link with a cipher takes only a manifest signed with its key (`diode
    tickets --manifest`, `diode verify --manifest --topology`): one altered, widened or forged
    is refused whole. Exit 1 when any entry was refused."""
    import json
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from diode.kafka import identity
    from diode.kafka.clients import admin_config, consumer_config
    from diode.kafka.refresh import topic_ids
    from diode.runtime.supervisor import Supervisor
    from diode.ticket_command import manifest_problem
    log = logging.getLogger("diode")
    t = topo.load(args.topology)
    try:
        manifest = json.loads(open(args.manifest).read())
        problem = manifest_problem(t, manifest)
        if problem:
            raise DiodeError(f"{args.manifest} is refused, nothing resent: {problem}")
        entries = []  # (topic, partition, incarnation or None, ranges)
        for entry in manifest["missing"]:
            said = entry.get("topicId")
            inc = None if said is None else identity.parse(str(said))
            if said is not None and inc is None:
                raise ValueError(f"topicId {said!r} is not a topic id")
            # (all zero: records whose incarnation the sender could not name, unchecked)
            entries.append((str(entry["topic"]), int(entry["partition"]),
                            None if inc == identity.NO_INCARNATION else inc,
                            [[int(a), int(b)] for a, b in entry["ranges"]]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DiodeError(f"{args.manifest} is not a resend manifest: {exc}") from None
    named = sorted({topic for topic, _, said, _ in entries if said is not None})
    try:
        current = topic_ids(AdminClient(admin_config(consumer_config(t))), named) \
            if named else {}
    except KafkaException as exc:
        raise DiodeError(f"cannot read the source topics' ids, to check that the manifest's "
                         f"ranges are of their current incarnation: {exc}") from None
    ranges, refused, unchecked = {}, {}, set()
    for topic, partition, said, spans in entries:
        now = current.get(topic)
        if said is None or now == identity.NO_INCARNATION:
            unchecked.add(topic)  # (a broker without topic ids cannot tell either)
        elif said != now:
            refused.setdefault((topic, said, now), []).append(partition)
            continue
        ranges.setdefault((topic, partition), []).extend(spans)
    if unchecked:
        log.warning("resending ranges of %s unchecked: no topic id to tell whether they are of "
                    "the topic's current incarnation (a manifest of a diode older than topic "
                    "ids, or a source broker without them)", ", ".join(sorted(unchecked)))
    problems = []
    for (topic, said, now), parts in sorted(refused.items(), key=lambda kv: kv[0][:2]):
        where = (f"{topic} partition(s) {', '.join(map(str, sorted(parts)))}: the manifest "
                 f"names topic id {identity.text(said)}")
        problems.append(f"{where}, the source cluster's {topic} is topic id "
                        f"{identity.text(now)}: another incarnation, whose offsets hold other "
                        "records; not resent" if now is not None else
                        f"{where}, and the source cluster has no topic {topic} now; not resent")
    if problems and not ranges:
        raise DiodeError("nothing resent:\n  " + "\n  ".join(problems))
    for problem in problems:
        log.error("%s", problem)
    if not ranges:
        print("nothing to resend", file=sys.stderr)
        return 0
    # its own processes and run directory beside a running sender; its brokers already run
    t = dataclasses.replace(t, sender=dataclasses.replace(t.sender, resend=ranges), brokers=[],
                            supervisor=dataclasses.replace(t.supervisor, run_dir=""))
    code = Supervisor(t, ("sender",), args.run_dir).run()
    return code or (1 if problems else 0)


def cmd_docs(args) -> int:
    if args.metrics:
        from diode.runtime import metrics
        print(metrics.reference_markdown(), end="")
    elif args.events:
        from diode.accounting import events
        print(events.reference_markdown(), end="")
    else:
        print(topo.reference_markdown(), end="")
    return 0


def cmd_produce(args) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    if args.partitions:
        admin = AdminClient({"bootstrap.servers": args.bootstrap})
        if args.topic not in admin.list_topics(timeout=10).topics:
            admin.create_topics([NewTopic(args.topic, args.partitions)])[args.topic].result(10)
    p = Producer({"bootstrap.servers": args.bootstrap})
    values = args.values or [line.rstrip("\n") for line in sys.stdin]
    for v in values:
        p.produce(args.topic, value=v.encode(), key=args.key.encode() if args.key else None)
        p.poll(0)
    left = p.flush(10)
    print(f"produced {len(values) - left} record(s) to {args.topic} on {args.bootstrap}",
          file=sys.stderr)
    return 1 if left else 0


def cmd_consume(args) -> int:
    """Print a topic's records from the beginning (assign, no group), with their headers."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "diode-console",
                  "enable.auto.commit": False})
    deadline = time.monotonic() + args.timeout
    seen = 0
    try:
        while time.monotonic() < deadline:
            md = c.list_topics(args.topic, timeout=5).topics.get(args.topic)
            if md is not None and md.error is None and md.partitions:
                c.assign([TopicPartition(args.topic, p, 0) for p in md.partitions])
                break
            time.sleep(0.2)
        while time.monotonic() < deadline and (not args.count or seen < args.count):
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            seen += 1
            headers = " ".join(f"{k}={(v or b'').decode(errors='replace')}"
                               for k, v in (m.headers() or []))
            print(f"{m.topic()}[{m.partition()}]@{m.offset()} "
                  f"{(m.value() or b'').decode(errors='replace')}  {headers}", flush=True)
    finally:
        c.close()
    return 0 if not args.count or seen >= args.count else 1


def installed_version() -> str:
    """The installed distribution's version (the wheel's, or the editable install's)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("diode")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


class VersionAction(argparse.Action):
    """--version: the installed version, looked up only when asked (not at every command's
    start: importlib.metadata scans the installed distributions, 11 ms here)."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"diode {installed_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """Every `diode` command and its options."""
    from diode.runtime.preflight import CLUSTER_TIMEOUT_SECONDS
    parser = argparse.ArgumentParser(prog="diode", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=VersionAction,
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="validate a topology, check what a launch of it needs on "
                       "this host, and print the plan (exit 2: invalid, or a launch would fail)")
    p.add_argument("file", help="the topology file (YAML)")
    p.add_argument("--side", choices=("sender", "receiver", "both"), default="both",
                   help="the side to check and show: its key, secrets and TLS files readable "
                   "here, its journal directory writable, its ports free, its cluster asked "
                   "(each host has its own side's)")
    p.add_argument("--timeout", type=float, default=CLUSTER_TIMEOUT_SECONDS, metavar="SECONDS",
                   help="how long each Kafka cluster has to answer, all asked at once "
                   "(default %(default)g; one that does not is a warning)")
    p.add_argument("--record-bytes", type=int, default=1024, metavar="N",
                   help="record size for the receiver capacity measurement (default 1024)")
    p.add_argument("--no-measure", action="store_true",
                   help="skip measuring whether this machine's receiver takes link.rate.mbps "
                   "(done when the link is paced and the receiver side is checked)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("launch", help="run a topology: brokers, supervisor and workers")
    p.add_argument("file", help="the topology file (YAML)")
    p.add_argument("--side", choices=("sender", "receiver", "both"), default="both",
                   help="the side to run on this host (default both, on one host)")
    p.add_argument("--run-dir", help="directory for ipc endpoints and metrics")
    p.add_argument("--broker-kind", choices=("kafka", "tansu"),
                   help="start the file's embedded brokers as this kind (brokers[].kind)")
    p.add_argument("--reset-state", action="store_true",
                   help="discard the receiver's journal and checkpoints in receiver.journal.dir "
                   "first (logging what they held): for a directory of another topology, or a "
                   "flow started anew")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("resend", help="on the high side: send a resend manifest's missing "
                       "ranges again (from diode verify or the missing-records topic); those of "
                       "another incarnation than the source topic's current one are refused")
    p.add_argument("manifest", help="JSON: {\"missing\": [{\"topic\", \"partition\", "
                   "\"topicId\", \"ranges\", \"tickets\"}, …], \"auth\": …} signed with the "
                   "link's key (docs/verification.md)")
    p.add_argument("--topology", required=True,
                   help="the sender's topology file (its pipeline sends, its key checks "
                   "the manifest)")
    p.add_argument("--run-dir", help="directory for ipc endpoints and metrics")
    p.set_defaults(func=cmd_resend)

    p = sub.add_parser("docs", help="print the topology reference (docs/topology.md)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--metrics", action="store_true",
                       help="the metrics reference instead (docs/metrics.md)")
    which.add_argument("--events", action="store_true",
                       help="the events and records diode writes instead (docs/events.md)")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("produce", help="produce lines (arguments or stdin) as records")
    p.add_argument("--bootstrap", required=True, help="the cluster's bootstrap servers")
    p.add_argument("--topic", required=True, help="the topic to produce to")
    p.add_argument("--key", help="the key of every record (default none)")
    p.add_argument("--partitions", type=int, default=0,
                   help="create the topic with this many partitions if it does not exist")
    p.add_argument("values", nargs="*",
                   help="the records' values, one a record (default: stdin, one a line)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print a topic's records and headers")
    p.add_argument("--bootstrap", required=True, help="the cluster's bootstrap servers")
    p.add_argument("--topic", required=True, help="the topic to read from its beginning")
    p.add_argument("--count", type=int, default=0, help="stop after this many (exit 1 if fewer)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to read for at most (default 30)")
    p.set_defaults(func=cmd_consume)

    from diode.link import linksim
    linksim.add_parser(sub)
    from diode.spark import command as verify  # (Spark itself is imported when it runs)
    verify.add_parser(sub)
    from diode.soak import run as soak
    soak.add_parser(sub)
    from diode import tune
    tune.add_parser(sub)
    from diode import connect_import
    connect_import.add_parser(sub)
    from diode import status
    status.add_parser(sub)
    from diode import ticket_command
    ticket_command.add_parser(sub)
    parser.subcommands = sub
    return parser


def commands(parser: argparse.ArgumentParser) -> set:
    """The names of the parser's commands."""
    return set(parser.subcommands.choices)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return args.func(args)
    except TopologyError as exc:
        print(exc, file=sys.stderr)
        return 2
    except DiodeError as exc:
        logging.getLogger("diode").error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
