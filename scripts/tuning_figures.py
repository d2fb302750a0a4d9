"""The figures of docs/tuning.md: `diode tune --json` on variants of the demo topology (record
size, datagram size, compression, FEC, cipher), each stage's CPU per record and per datagram
as measured on this machine, printed as markdown tables. Run by ./scripts/tuning-figures (a
few minutes; not a test)."""

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("kafka_reader", "packer", "udp_sender", "udp_reader", "unpacker", "kafka_writer")
# (table, label, topology changes (dotted keys), record bytes, records/s)
VARIANTS = [
    ("record size", "100 B", {}, 100, 20000),
    ("record size", "1 000 B", {}, 1000, 10000),
    ("record size", "10 000 B", {}, 10000, 2000),
    ("datagram size", "1 472 B (MTU 1500)", {"link.datagram.size.bytes": 1472}, 200, 20000),
    ("datagram size", "8 972 B (jumbo)", {"link.datagram.size.bytes": 8972}, 200, 20000),
    ("datagram size", "65 000 B (loopback)", {}, 200, 20000),
    ("compression", "none", {"compression": "none"}, 1000, 10000),
    ("compression", "lz4", {"compression": "lz4"}, 1000, 10000),
    ("compression", "zstd", {}, 1000, 10000),
    ("compression", "gzip", {"compression": "gzip"}, 1000, 10000),
    ("FEC and cipher", "aes-256-gcm, no FEC", {}, 200, 20000),
    ("FEC and cipher", "FEC 8+2", {"link.fec.data.datagrams": 8,
                                   "link.fec.parity.datagrams": 2}, 200, 20000),
    ("FEC and cipher", "chacha20-poly1305", {"security.cipher": "chacha20-poly1305"}, 200,
     20000),
]


def variant(base: dict, changes: dict) -> dict:
    data = copy.deepcopy(base)
    for key, value in changes.items():
        section, _, rest = key.partition(".")
        if rest:
            data.setdefault(section, {})[rest] = value
        else:
            data[section] = value
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--topology", default=str(ROOT / "topology.yaml"))
    ap.add_argument("--broker-kind", default="kafka", choices=("kafka", "tansu"))
    ap.add_argument("--only", help="run the variants of this table only")
    ap.add_argument("--json", help="also write every result here")
    args = ap.parse_args()
    base = yaml.safe_load(Path(args.topology).read_text())
    work = Path(tempfile.mkdtemp(prefix="diode-tuning-figures-"))
    password = work / "password"
    password.write_text("tuning figures\n")
    base.setdefault("security", {})["password.file"] = str(password)
    base.pop("brokers", None)  # measured on embedded brokers of --broker-kind
    results = []
    for table, label, changes, size, rate in VARIANTS:
        if args.only and table != args.only:
            continue
        path = work / f"v{len(results)}.yaml"
        path.write_text(yaml.safe_dump(variant(base, changes), sort_keys=False))
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "diode", "tune", str(path), "--rate",
                            str(rate), "--record-size", str(size), "--json", "--broker-kind",
                            args.broker_kind], capture_output=True, text=True)
        if r.returncode not in (0, 1):
            print(f"{table} / {label}: diode tune failed:\n{r.stderr[-3000:]}", file=sys.stderr)
            return 1
        advice = json.loads(r.stdout)
        results.append({"table": table, "label": label, "size": size, "rate": rate,
                        "advice": advice})
        print(f"{table} / {label}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    for table in dict.fromkeys(r["table"] for r in results):
        rows = [r for r in results if r["table"] == table]
        print(f"\n### {table}\n")
        print("| variant | records/s | records/datagram | " + " | ".join(STAGES) +
              " | total |")
        print("| --- | ---: | ---: | " + " | ".join("---:" for _ in STAGES) + " | ---: |")
        for r in rows:
            a = r["advice"]
            cells = [f"{a['stages'][s]['cost_us_per_record']:.2f} "
                     f"({a['stages'][s]['cost_us_per_datagram']:.0f})" for s in STAGES]
            total = sum(a["stages"][s]["cost_us_per_record"] for s in STAGES)
            print(f"| {r['label']}, {r['size']} B records | {a['measured']['rate']:,} | "
                  f"{a['measured']['records_per_datagram']:g} | " + " | ".join(cells) +
                  f" | {total:.1f} |")
    print("\nEach cell: CPU µs per record at that rate (the fitted µs per datagram in "
          "parentheses).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
