"""The `diode` command."""

import argparse
import dataclasses
import logging
import sys
import time

from diode.runtime import topology as topo
from diode.runtime import wiring
from diode.errors import DiodeError, TopologyError
from diode.runtime.worker import configure_logging


def kafka_problems(t, sides=topo.SIDES) -> list[str]:
    """librdkafka's own verdict on the pass-through settings (unknown keys, bad values), found
    by building the clients without connecting, after reading the ${file:...} and ${env:...}
    they name. Only `diode check` does this: the supervisor must not create Kafka clients
    before it forks."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from diode.errors import SecretError
    from diode.kafka.clients import client_settings, consumer_config, producer_config
    makers = {"sender": lambda: Consumer(consumer_config(t)).close(),
              "receiver": lambda: Producer(producer_config(client_settings(t, "receiver")))}
    problems = []
    for side in sides:
        try:
            makers[side]()
        except SecretError as exc:
            problems.append(f"{side}.kafka: {exc}")
        except KafkaException as exc:
            err = exc.args[0]
            problems.append(f"{side}.kafka: {err.str() if hasattr(err, 'str') else err}")
    return problems


def cmd_check(args) -> int:
    t = topo.load(args.file)
    problems = kafka_problems(t, topo.SIDES if args.side == "both" else (args.side,))
    if problems:
        raise TopologyError(t.path, problems)
    run_dir = t.supervisor.run_dir or "<run dir>"
    print(f"topology {t.name} ({t.path}): valid")
    print(f"link: udp {t.link.host}:{t.link.port} (receiver binds {t.link.bind_address}), "
          f"datagrams up to {t.link.datagram_size_bytes} bytes, "
          f"{t.link.rate_mbps:g} Mbit/s{' (unpaced)' if not t.link.rate_mbps else ''}")
    print(f"security: {t.security.cipher}, compression: {t.compression}")
    r = t.receiver
    print(f"receive journal: {t.resolve(r.journal_dir)} (up to {r.journal_max_bytes} bytes, "
          f"fsync {r.journal_fsync}, checkpoints every {r.checkpoint_interval_ms:g} ms)"
          if r.journal_enabled else "receive journal: off (a receiver restart loses what is in "
          "flight, reported missing)")
    for b in t.brokers:
        print(f"embedded {b.kind} broker {b.name or b.listen}: {b.listen} ({b.side} side)")
    print(f"{'process':<28} {'cpus':<10} endpoints")
    for spec in topo.plan(t):
        cpus = ",".join(map(str, spec.cpus)) or "all"
        binds, connects = wiring.describe(t, spec, run_dir)
        print(f"diode: {spec.name:<20} {cpus:<10} "
              + "; ".join([f"binds {e}" for e in binds] + [f"-> {e}" for e in connects]))
    if args.side != "sender" and t.link.rate_mbps and not args.no_measure:
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
    sides = topo.SIDES if args.side == "both" else (args.side,)
    return Supervisor(t, sides, args.run_dir).run()


def cmd_resend(args) -> int:
    """Send exactly the manifest's ranges again through the sender pipeline, then exit."""
    import json
    from diode.runtime.supervisor import Supervisor
    t = topo.load(args.topology)
    try:
        manifest = json.loads(open(args.manifest).read())
        ranges = {}
        for entry in manifest["missing"]:
            key = (str(entry["topic"]), int(entry["partition"]))
            ranges.setdefault(key, []).extend([int(a), int(b)] for a, b in entry["ranges"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DiodeError(f"{args.manifest} is not a resend manifest: {exc}") from None
    if not ranges:
        print("nothing to resend", file=sys.stderr)
        return 0
    # its own processes and run directory beside a running sender; its brokers already run
    t = dataclasses.replace(t, sender=dataclasses.replace(t.sender, resend=ranges), brokers=[],
                            supervisor=dataclasses.replace(t.supervisor, run_dir=""))
    return Supervisor(t, ("sender",), args.run_dir).run()


def cmd_docs(args) -> int:
    if args.metrics:
        from diode.runtime import metrics
        print(metrics.reference_markdown(), end="")
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


def build_parser() -> argparse.ArgumentParser:
    """Every `diode` command and its options."""
    parser = argparse.ArgumentParser(prog="diode", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="validate a topology and print the plan (exit 2: invalid)")
    p.add_argument("file")
    p.add_argument("--side", choices=("sender", "receiver", "both"), default="both",
                   help="the side whose ${file:...}/${env:...} Kafka settings must be readable "
                   "here (each host has its own side's secrets)")
    p.add_argument("--record-bytes", type=int, default=1024, metavar="N",
                   help="record size for the receiver capacity measurement (default 1024)")
    p.add_argument("--no-measure", action="store_true",
                   help="skip measuring whether this machine's receiver takes link.rate.mbps "
                   "(done when the link is paced and the receiver side is checked)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("launch", help="run a topology: brokers, supervisor and workers")
    p.add_argument("file")
    p.add_argument("--side", choices=("sender", "receiver", "both"), default="both")
    p.add_argument("--run-dir", help="directory for ipc endpoints and metrics")
    p.add_argument("--broker-kind", choices=("kafka", "tansu"),
                   help="start the file's embedded brokers as this kind (brokers[].kind)")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("resend", help="on the high side: send a resend manifest's missing "
                       "ranges again (from diode verify or the missing-records topic)")
    p.add_argument("manifest")
    p.add_argument("--topology", required=True)
    p.add_argument("--run-dir", help="directory for ipc endpoints and metrics")
    p.set_defaults(func=cmd_resend)

    p = sub.add_parser("docs", help="print the topology reference (docs/topology.md)")
    p.add_argument("--metrics", action="store_true",
                   help="the metrics reference instead (docs/metrics.md)")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("produce", help="produce lines (arguments or stdin) as records")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--key")
    p.add_argument("--partitions", type=int, default=0,
                   help="create the topic with this many partitions if it does not exist")
    p.add_argument("values", nargs="*")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print a topic's records and headers")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=0, help="stop after this many (exit 1 if fewer)")
    p.add_argument("--timeout", type=float, default=30.0)
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
