"""The datagram-size figures of docs/performance.md: each side alone (./scripts/bench --mode
sender and --mode receiver) by datagram size (1472, 8972, 65000) and record size (100 B,
10 KiB), over loopback and across the two-host test bed's veth pair, with UDP GSO/GRO on and
off, beside iperf3's UDP on the same path in the same run (the physical anchor). Printed as a
markdown table; every figure is one bench run's, each bench run's JSON line kept in --json.
Run by ./scripts/datagram-figures (as root, for the test bed; about 15 minutes). Not a test."""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (path, veth MTU, datagram bytes): 65000 over an MTU of 9000 crosses as 8 IP fragments
PATHS = [("loopback", None, 1472), ("loopback", None, 8972), ("loopback", None, 65000),
         ("veth", 1500, 1472), ("veth", 9000, 8972), ("veth", 9000, 65000)]


def bench(args, path, mtu, size, mode, offload, out) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts/bench.py"), "--mode", mode, "--path", path,
           "--datagram-bytes", str(size), "--broker", args.broker, "--repeat", "1",
           "--skip-baseline", "--records-small", str(args.records_small),
           "--records-large", str(args.records_large), "--json", out]
    if mtu:
        cmd += ["--mtu", str(mtu)]
    if not offload:
        cmd += ["--no-offload"]
    if mode == "receiver" or not offload:
        cmd += ["--no-anchor"]  # (the sender run with offload measured it)
    print(f"# {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    if done.returncode:
        return {}
    return json.loads(Path(out).read_text().splitlines()[-1])


def figures(result: dict, mode: str, size_name: str) -> str:
    rows = result.get("modes", {}).get(mode, {}).get("sizes", {}).get(size_name, [])
    if not rows:
        return "failed"
    r = rows[-1]
    # From the first records seen to the last (start-up left out), over the records seen in
    # between; the whole run's rate when it was too short for that.
    if r.get("steady_records") and r.get("seconds_first_to_last"):
        steady = r["steady_records"] / r["seconds_first_to_last"]
    else:
        steady = r["received"] / r["seconds"] if r["seconds"] else 0
    bits = steady * r["value_bytes"] / r["received"] * 8 / 1e6 if r["received"] else 0
    lost = f", **{r['missing']} lost**" if r["missing"] else ""
    return f"{steady:,.0f}/s, {bits:,.0f} Mbit/s{lost}"


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="scripts/datagram-figures", description=__doc__)
    ap.add_argument("--broker", default="tansu", choices=("kafka", "tansu"))
    ap.add_argument("--records-small", type=int, default=600000)
    ap.add_argument("--records-large", type=int, default=60000)
    ap.add_argument("--json", help="keep every bench run's JSON line here")
    ap.add_argument("--only", action="append", default=[], metavar="PATH:BYTES",
                    help="only these rows, e.g. veth:65000 (repeatable)")
    args = ap.parse_args(argv)
    out = args.json or tempfile.mktemp(prefix="diode-datagram-figures-", suffix=".jsonl")
    print("| path | datagram | GSO/GRO | iperf3 UDP | sender 100 B | sender 10 KiB | "
          "receiver 100 B | receiver 10 KiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path, mtu, size in PATHS:
        if args.only and f"{path}:{size}" not in args.only:
            continue
        for offload in (True, False):
            sent = bench(args, path, mtu, size, "sender", offload, out)
            got = bench(args, path, mtu, size, "receiver", offload, out)
            a = sent.get("anchor", {})
            anchor = (f"{a['receiver_mbps']:,.0f} Mbit/s" if "receiver_mbps" in a else
                      "-" if not offload else a.get("error", "failed"))
            where = f"veth, MTU {mtu}" if mtu else "loopback"
            print(f"| {where} | {size} | {'on' if offload else 'off'} | {anchor} | "
                  f"{figures(sent, 'sender', 'small')} | {figures(sent, 'sender', 'large')} | "
                  f"{figures(got, 'receiver', 'small')} | {figures(got, 'receiver', 'large')} |",
                  flush=True)
    print(f"\nJSON lines: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
