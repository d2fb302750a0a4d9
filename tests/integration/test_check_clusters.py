"""`diode check` asks each cluster whether it answers and holds the topics to replicate, as a
warning within a short timeout, with nothing of librdkafka's own on the terminal."""

import subprocess
import sys
import time

from diode.kafka.brokers import free_port
from tests.conftest import ROOT, create_topic, write_topology


def check(path, *extra):
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "diode", "check", str(path), "--no-measure",
                        *extra], capture_output=True, text=True, cwd=ROOT, timeout=120)
    return r, time.monotonic() - started


def no_librdkafka(stderr: str) -> bool:
    """Nothing of librdkafka's log: neither its own lines (`%3|...|FAIL|rdkafka#producer-1|
    ...`) nor its lines forwarded to a Python logger (`diode.librdkafka.sender`)."""
    return "rdkafka" not in stderr and not any(line.startswith("%")
                                               for line in stderr.splitlines())


def test_a_reachable_cluster_gives_no_warning_an_unreachable_one_does_in_time(tmp_path, brokers):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 1)
    answered = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    r, _ = check(answered)
    assert r.returncode == 0, r.stderr
    assert "kafka" not in r.stderr and no_librdkafka(r.stderr), r.stderr
    assert f"checked: the source cluster ({src.bootstrap}): answered" in r.stdout
    assert f"checked: the destination cluster ({dst.bootstrap}): answered" in r.stdout
    assert "dst_src made by the receiver at its first record" in r.stdout

    (tmp_path / "gone").mkdir()
    nothing = f"127.0.0.1:{free_port()}"  # nobody listens there
    gone = write_topology(tmp_path / "gone", src.bootstrap, nothing,
                          sender={"topics": ["src", "absent"]})
    r, took = check(gone, "--timeout", "2")
    assert r.returncode == 0, r.stderr  # a warning: the cluster may come up after the diode
    assert (f"warning: receiver.kafka: the destination cluster ({nothing}) did not answer "
            f"within 2 s: Connect to ipv4#{nothing} failed: Connection refused") in r.stderr
    assert "warning: sender.topics: absent not on the source cluster" in r.stderr
    assert "warning: sender.kafka" not in r.stderr
    assert no_librdkafka(r.stderr), r.stderr
    assert took < 2 + 20, took  # the clusters are asked at once, each within the timeout

    r, _ = check(gone, "--timeout", "2", "--side", "sender")  # the sender's host alone
    assert r.returncode == 0 and "destination" not in r.stderr + r.stdout, r.stderr
