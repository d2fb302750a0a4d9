"""The `diode` command."""

import argparse
import dataclasses
import logging
import sys
import time

from diode.link import path as link_path
from diode.runtime import topology as topo
from diode.runtime import wiring
from diode.errors import ClusterError, DiodeError, TopologyError
from diode.runtime.worker import configure_logging


def cmd_check(args) -> int:
    """Validate the topology, then check on this host what a launch of the side(s) asked would
    need (diode.runtime.preflight): problems exit 2, warnings are printed and exit 0; then the
    plan of those sides."""
    from diode.runtime import preflight, statedir
    t = topo.for_this_host(topo.load(args.file))
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


def cmd_docs(args) -> int:
    if args.metrics:
        from diode.runtime import metrics
        print(metrics.reference_markdown(), end="")
    elif args.events:
        from diode.kafka import messages
        print(messages.reference_markdown(), end="")
    else:
        print(topo.reference_markdown(), end="")
    return 0


def cmd_produce(args) -> int:
    """Produce the values given (or stdin's lines) to a topic of the cluster the options give
    (diode.kafka.cluster), creating it first with --partitions; exit 1 when any record was not
    acknowledged, 2 when the cluster cannot be used."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from diode.kafka.clients import create_topic
    from diode.kafka.cluster import of_args, reach
    cluster = of_args(args, "sender")
    md = reach(cluster)
    if args.partitions and args.topic not in md.topics:
        create_topic(AdminClient(cluster.admin_config()), args.topic, args.partitions)
    p = Producer(cluster.config())
    failed = []
    values = args.values or [line.rstrip("\n") for line in sys.stdin]
    for v in values:
        p.produce(args.topic, value=v.encode(), key=args.key.encode() if args.key else None,
                  on_delivery=lambda err, _: failed.append(err) if err else None)
        p.poll(0)
    left = p.flush(10)
    done = len(values) - left - len(failed)
    print(f"produced {done} record(s) to {args.topic} on {cluster.name}", file=sys.stderr)
    if failed or left:
        print(f"{len(failed) + left} record(s) not written: "
              f"{failed[0].str() if failed else 'not acknowledged within 10 s'}",
              file=sys.stderr)
    return 1 if failed or left else 0


def cmd_consume(args) -> int:
    """Print a topic's records from the beginning (assign, no group), with their headers, from
    the cluster the options give (diode.kafka.cluster)."""
    from confluent_kafka import Consumer, TopicPartition

    from diode.kafka.cluster import CONNECT_TIMEOUT_SECONDS, of_args, reach
    cluster = of_args(args, "receiver")
    reach(cluster, min(args.timeout, CONNECT_TIMEOUT_SECONDS))
    c = Consumer(cluster.config(**{"group.id": "diode-console", "enable.auto.commit": False}))
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


def add_common(parser: argparse.ArgumentParser, default=False) -> None:
    """The options every command takes, before its name or after it."""
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="debug logging")


class CommandParser(argparse.ArgumentParser):
    """A command's parser: it takes the common options too (`diode status -v` as `diode -v
    status`). Left out, they keep what was given before the command's name (argparse would
    otherwise set a command's defaults over it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        add_common(self, default=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """Every `diode` command and its options."""
    from diode.kafka.cluster import add_options as add_cluster_options
    from diode.runtime.preflight import CLUSTER_TIMEOUT_SECONDS
    parser = argparse.ArgumentParser(prog="diode", description=__doc__)
    add_common(parser)
    parser.add_argument("--version", action=VersionAction,
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

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

    p = sub.add_parser("docs", help="print the topology reference (docs/topology.md)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--metrics", action="store_true",
                       help="the metrics reference instead (docs/metrics.md)")
    which.add_argument("--events", action="store_true",
                       help="the events and records diode writes instead (docs/events.md)")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("produce", help="produce lines (arguments or stdin) as records, to the "
                       "source cluster by default (docs/clients.md)")
    add_cluster_options(p, "sender", either_side=True)
    p.add_argument("--topic", required=True, help="the topic to produce to")
    p.add_argument("--key", help="the key of every record (default none)")
    p.add_argument("--partitions", type=int, default=0,
                   help="create the topic with this many partitions if it does not exist")
    p.add_argument("values", nargs="*",
                   help="the records' values, one a record (default: stdin, one a line)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print a topic's records and headers, from the "
                       "destination cluster by default (docs/clients.md)")
    add_cluster_options(p, "receiver", either_side=True)
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
    from diode.connect_import import command as connect_import
    connect_import.add_parser(sub)
    from diode import status
    status.add_parser(sub)
    from diode import ticket_command
    ticket_command.add_parser(sub)
    from diode import resend
    resend.add_parser(sub)
    from diode import deploy_files
    deploy_files.add_parser(sub)
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
    except ClusterError as exc:  # (the settings of a cluster, or the cluster, cannot be used)
        logging.getLogger("diode").error("%s", exc)
        return 2
    except DiodeError as exc:
        logging.getLogger("diode").error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
