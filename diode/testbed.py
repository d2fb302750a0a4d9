"""A two-host test bed on one machine: the receiving host in a network namespace of its own,
joined to this one (the sending host) by a veth pair, as a diode joins two hosts.

    scripts/testbed up [--mtu 1500|9000] [--name diode-low]    # prints what it made
    scripts/testbed down [--name diode-low]

The namespace gets the low address (10.203.N.2 by default) on its end of the pair, this host the
high one (10.203.N.1); both ends have the MTU asked for, so a datagram larger than it crosses
as IP fragments, as on a real link, and the link never runs over 127.0.0.1. The kernel here has
no netem: loss, reordering and duplication come from `diode link-sim`, run on this host between
the sender and the namespace. Run a command on the receiving host with
`ip netns exec NAME ...` (Bed.run_in gives the argument list). Needs root (CAP_NET_ADMIN) and
iproute2; says so when it does not have them.
"""

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from diode.errors import DiodeError

DEFAULT_NAME = "diode-low"
SUBNET = "10.203"


@dataclass(frozen=True)
class Bed:
    name: str          # the network namespace of the receiving host
    high: str          # this host's address on the pair (the sending host)
    low: str           # the namespace's address on the pair (the receiving host)
    high_device: str
    low_device: str
    mtu: int

    def run_in(self, argv: list) -> list:
        """`argv` run on the receiving host (in the namespace)."""
        return ["ip", "netns", "exec", self.name, *argv]


def usable() -> str:
    """Why a test bed cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "the two-host test bed needs root (network namespaces and a veth pair)"
    if shutil.which("ip") is None:
        return ("the two-host test bed needs iproute2's ip command (Debian: apt-get install "
                "iproute2)")
    return ""


def plan(name: str = DEFAULT_NAME, mtu: int = 1500, subnet: int | None = None) -> Bed:
    """The bed's names and addresses (interface names fit Linux's 15 characters)."""
    n = subnet if subnet is not None else sum(name.encode()) % 200 + 1
    tag = name[-9:]
    return Bed(name, f"{SUBNET}.{n}.1", f"{SUBNET}.{n}.2", f"{tag}-h", f"{tag}-l", mtu)


def up(bed: Bed) -> Bed:
    """Make the namespace and the pair (an old one of the same name goes first)."""
    why = usable()
    if why:
        raise DiodeError(why)
    down(bed)
    steps = [
        ["ip", "netns", "add", bed.name],
        ["ip", "link", "add", bed.high_device, "type", "veth", "peer", "name", bed.low_device],
        ["ip", "link", "set", bed.low_device, "netns", bed.name],
        ["ip", "addr", "add", f"{bed.high}/24", "dev", bed.high_device],
        ["ip", "link", "set", bed.high_device, "mtu", str(bed.mtu), "up"],
        bed.run_in(["ip", "addr", "add", f"{bed.low}/24", "dev", bed.low_device]),
        bed.run_in(["ip", "link", "set", bed.low_device, "mtu", str(bed.mtu), "up"]),
        bed.run_in(["ip", "link", "set", "lo", "up"]),
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            down(bed)
            raise DiodeError(f"test bed: {' '.join(step)} failed: {done.stderr.strip()}")
    return bed


def down(bed: Bed) -> None:
    """Remove the namespace (its end of the pair goes with it, and so does ours)."""
    subprocess.run(["ip", "netns", "del", bed.name], capture_output=True)
    subprocess.run(["ip", "link", "del", bed.high_device], capture_output=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/testbed", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("up", "down"))
    p.add_argument("--name", default=DEFAULT_NAME, help="the receiving host's namespace")
    p.add_argument("--mtu", type=int, default=1500, help="of both ends of the pair")
    args = p.parse_args(argv)
    bed = plan(args.name, args.mtu)
    try:
        if args.action == "down":
            down(bed)
            print(f"test bed {bed.name}: removed")
            return 0
        up(bed)
    except DiodeError as exc:
        print(f"scripts/testbed: {exc}", file=sys.stderr)
        return 1
    print(f"test bed {bed.name}: this host {bed.high} ({bed.high_device}), the receiving host "
          f"{bed.low} ({bed.low_device}, namespace {bed.name}), MTU {bed.mtu}.\n"
          f"Run the receiver there: ip netns exec {bed.name} .venv/bin/diode launch FILE "
          f"--side receiver (link.host: {bed.low})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
