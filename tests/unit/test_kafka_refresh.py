"""The partition watcher asks the source cluster from a thread of its own: the reader's loop
takes what it found without ever waiting, and a cluster that does not answer is an error it
reports, not a stall."""

import socket
import time

from diode.kafka.refresh import PartitionWatcher


def test_a_cluster_that_does_not_answer_is_reported_and_never_waited_for():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    watcher = PartitionWatcher({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "t",
                                "socket.connection.setup.timeout.ms": 1000},
                               lambda counts: set(counts), interval=0.2).start()
    try:
        found, deadline = [], time.monotonic() + 20
        while not found and time.monotonic() < deadline:
            began = time.monotonic()
            found = watcher.take()
            # the loop's call returns at once: not after the cluster's request (10 s at most,
            # the connection's 1 s here)
            assert time.monotonic() - began < 0.5
            time.sleep(0.1)  # (polled: the thread's findings come when its request fails)
        assert found and found[0].error and not found[0].new and not found[0].counts
    finally:
        began = time.monotonic()
        watcher.close()
        assert time.monotonic() - began < 20  # (not a hang: a request waits 10 s at most)
