"""The physical anchor of the sender and receiver figures: iperf3 (Debian's package) sending UDP
datagrams of the bench's size as fast as it can over the same path (loopback, or the test
bed's veth pair to its receiving host), in the same run. What it moves is what this machine's
kernel and one core can move with one send and one receive per datagram and no work on them:
no Python, no crypto, no Kafka."""

import json
import shutil
import subprocess

from diode.kafka.brokers import free_port

from .resources import Bench, log

SECONDS = 5


def available() -> str:
    """The iperf3 binary, installed from Debian's packages when missing and we may ("" when
    it cannot be had: the anchor is left out, and the report says so)."""
    found = shutil.which("iperf3")
    if found or not shutil.which("apt-get"):
        return found or ""
    log("iperf3 is not installed: apt-get install iperf3 (the physical anchor of the figures)")
    done = subprocess.run(["apt-get", "install", "-y", "-q", "iperf3"], capture_output=True,
                          text=True, env={"DEBIAN_FRONTEND": "noninteractive",
                                          "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    if done.returncode:
        log("could not install iperf3 (" + (done.stderr.strip().splitlines() or ["?"])[-1]
            + "): no anchor")
    return shutil.which("iperf3") or ""


def measure(b: Bench, datagram_bytes: int) -> dict:
    """iperf3 -u unpaced for SECONDS with `datagram_bytes`-byte datagrams to the receiving
    host: {"sender_mbps", "receiver_mbps", "lost_percent", "datagrams_per_second"} or
    {"error": why}."""
    binary = available()
    if not binary:
        return {"error": "iperf3 not available"}
    res, port = b.res, free_port()
    server = res.popen(res.low_host([binary, "-s", "-1", "-B", res.link_host, "-p", str(port)]),
                       pipes=True)
    try:
        args = [binary, "-u", "-b", "0", "-l", str(datagram_bytes), "-t", str(SECONDS), "-J",
                "-c", res.link_host, "-p", str(port)]
        for _ in range(50):  # until the server listens
            done = subprocess.run(args, capture_output=True, text=True, timeout=SECONDS + 30)
            if "Connection refused" not in done.stdout + done.stderr:
                break
        try:
            end = json.loads(done.stdout)["end"]
        except (ValueError, KeyError):
            return {"error": (done.stdout + done.stderr).strip()[-300:]}
        summary = end.get("sum", {})
        received = end.get("sum_received", summary)
        seconds = summary.get("seconds") or SECONDS
        packets = summary.get("packets", 0) - summary.get("lost_packets", 0)
        return {"sender_mbps": end.get("sum_sent", summary).get("bits_per_second", 0) / 1e6,
                "receiver_mbps": received.get("bits_per_second", 0) / 1e6,
                "lost_percent": summary.get("lost_percent", 0.0),
                "datagrams_per_second": packets / seconds}
    finally:
        res.stop_proc(server, 5)
