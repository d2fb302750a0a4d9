"""The hostile-link figures of docs/lab.md: each scenario replicates N records through
`diode link-sim` with faults and reports what arrived, what was reported missing and how exact
that report is. Run by ./scripts/link-figures (not a test: the tests assert the thresholds)."""

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diode.kafka.brokers import free_port, make_broker
from diode.link.linksim import Faults, FaultSettings, LinkSim
from diode.runtime.launches import Launch

SCENARIOS = [
    ("5 % loss, no repair", FaultSettings(loss=0.05, seed=11), {}),
    ("1 % loss, FEC 8+2", FaultSettings(loss=0.01, seed=21),
     {"fec.data.datagrams": 8, "fec.parity.datagrams": 2}),
    ("bursts of 5, FEC 8+2 depth 1", FaultSettings(burst_probability=0.01, burst_length=5,
                                                   seed=8),
     {"fec.data.datagrams": 8, "fec.parity.datagrams": 2}),
    ("bursts of 5, FEC 8+2 depth 4", FaultSettings(burst_probability=0.01, burst_length=5,
                                                   seed=8),
     {"fec.data.datagrams": 8, "fec.parity.datagrams": 2, "fec.interleave.depth": 4}),
    ("5 % loss, 2 copies", FaultSettings(loss=0.05, seed=4), {"copies": 2}),
    ("2 % reorder, 1 % duplication", FaultSettings(reorder=0.02, reorder_delay_ms=20,
                                                   duplicate=0.01, seed=5), {}),
]


def topology(work: Path, side: str, src, dst, port: int, link: dict) -> Path:
    data = {
        "name": "figures", "link": {"host": "127.0.0.1", "port": port,
                                    "bind.address": "127.0.0.1",
                                    "source.addresses": ["127.0.0.1"], "datagram.size.bytes": 600,
                                    "rate.mbps": 100, **link},
        "security": {"password.file": str(work / "password"), "salt": "figures"},
        "sender": {"kafka": {"bootstrap.servers": src.bootstrap}, "topics": ["src"],
                   "refresh.topics.interval.seconds": 0.5, "heartbeat.interval.ms": 300},
        "receiver": {"kafka": {"bootstrap.servers": dst.bootstrap}, "topic.prefix": "dst_",
                     "reorder.wait.ms": 500, "missing.records.topic": "missing"},
    }
    path = work / f"{side}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def read_all(bootstrap: str, topic: str, idle: float = 3.0) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "figures",
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=5).topics.get(topic)
    if md is None or md.error is not None:
        c.close()
        return []
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out, quiet = [], time.monotonic() + idle
    while time.monotonic() < quiet:
        msgs = [m for m in c.consume(1000, timeout=0.2) if m.error() is None]
        if msgs:
            out += msgs
            quiet = time.monotonic() + idle
    c.close()
    return out


def run(name, faults, link, records: int, partitions: int = 2) -> dict:
    with tempfile.TemporaryDirectory(prefix="diode-figures-") as tmp:
        work = Path(tmp)
        (work / "password").write_text("figures\n")
        (work / "password").chmod(0o600)
        src = make_broker("tansu", "source", f"127.0.0.1:{free_port()}").start()
        dst = make_broker("tansu", "destination", f"127.0.0.1:{free_port()}").start()
        procs, stop = [], threading.Event()
        try:
            rport = free_port(socket.SOCK_DGRAM)
            sim = LinkSim(("127.0.0.1", 0), ("127.0.0.1", rport), Faults(faults))
            sim_thread = threading.Thread(target=sim.run, args=(stop.is_set,), daemon=True)
            sim_thread.start()
            for side, port in (("receiver", rport), ("sender", sim.port)):
                procs.append(Launch(topology(work, side, src, dst, port, link), side).start())
            admin = AdminClient({"bootstrap.servers": src.bootstrap})
            admin.create_topics([NewTopic("src", partitions)])["src"].result(10)
            p = Producer({"bootstrap.servers": src.bootstrap, "linger.ms": 5})
            for i in range(records):
                p.produce("src", value=b"%07d" % i, partition=i % partitions)
                p.poll(0)
            p.flush(30)
            time.sleep(4)  # a few heartbeats and reorder waits
            got = read_all(dst.bootstrap, "dst_src")
            events = [json.loads(m.value()) for m in read_all(dst.bootstrap, "missing", 1.0)]
        finally:
            for proc in reversed(procs):
                proc.stop(timeout=30)
            stop.set()
            src.stop()
            dst.stop()
    coords = []
    for m in got:
        h = dict(m.headers())
        coords.append((int(h["sourcePartition"]), int(h["sourceOffset"]), m.partition()))
    arrived = {(pp, o) for pp, o, _ in coords}
    sent = {(pp, o) for pp in range(partitions) for o in range(records // partitions)}
    reported = set()
    for e in events:
        span = {(e["sourcePartition"], o) for o in range(e["firstOffset"], e["lastOffset"] + 1)}
        reported = reported | span if e["type"] == "missing" else reported - span
    in_order = all(
        [o for pp, o, dp in coords if dp == part] ==
        sorted(o for pp, o, dp in coords if dp == part) for part in range(partitions))
    c = sim.faults.counts
    return {"scenario": name, "records": records, "datagrams": c.received,
            "lost_datagrams": c.dropped + c.burst_dropped, "delivered": len(arrived),
            "delivered_pct": 100.0 * len(arrived) / records,
            "duplicates_written": len(coords) - len(arrived), "in_order": in_order,
            "absent": len(sent - arrived), "reported_missing": len(reported),
            "false_positives": len(reported & arrived),
            "false_negatives": len((sent - arrived) - reported)}


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=6000)
    parser.add_argument("--json", help="append one JSON line per scenario to this file")
    args = parser.parse_args(argv)
    print("| scenario | records | datagrams | lost datagrams | delivered | duplicates written "
          "| in source order | absent | reported missing | false positives | false negatives |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, faults, link in SCENARIOS:
        r = run(name, faults, link, args.records)
        print(f"| {r['scenario']} | {r['records']} | {r['datagrams']} | {r['lost_datagrams']} "
              f"| {r['delivered']} ({r['delivered_pct']:.2f} %) | {r['duplicates_written']} "
              f"| {'yes' if r['in_order'] else 'NO'} | {r['absent']} | {r['reported_missing']} "
              f"| {r['false_positives']} | {r['false_negatives']} |", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
