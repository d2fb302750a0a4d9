"""Fixtures of the integration tests that need more than tests/conftest.py's."""

import socket
import threading

import pytest

from diode.link.linksim import Faults, LinkSim
from tests.conftest import deep_merge, free_port, write_topology

SENDER, RECEIVER = 3, 3


class Link:
    """Sender -> link-sim (faults) -> receiver, each side launched with its own topology: the
    receiver first, or with `receiver_later` when the test calls start_receiver()."""

    def __init__(self, tmp_path, brokers, launch, faults: Faults, receiver_later: bool = False,
                 **overrides):
        self.src, self.dst = brokers
        self.launch = launch
        self.receiver_port = free_port(socket.SOCK_DGRAM)
        common = deep_merge(overrides, {
            "sender": {"heartbeat.interval.ms": 300},
            "receiver": {"reorder.wait.ms": 500, "missing.records.topic": "missing"}})
        rdir, sdir = tmp_path / "receiver", tmp_path / "sender"
        rdir.mkdir()
        sdir.mkdir()
        self.receiver_topo = write_topology(rdir, self.src.bootstrap, self.dst.bootstrap,
                                            **deep_merge(common, {"link": {"port":
                                                                     self.receiver_port}}))
        self.sim = LinkSim(("127.0.0.1", 0), ("127.0.0.1", self.receiver_port), faults)
        self.sender_topo = write_topology(sdir, self.src.bootstrap, self.dst.bootstrap,
                                          **deep_merge(common, {"link": {"port": self.sim.port}}))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sim.run, args=(self.stop.is_set,),
                                       daemon=True)
        self.thread.start()
        self.receiver = None if receiver_later else self.start_receiver()
        self.sender = launch(self.sender_topo, side="sender", workers=SENDER)

    def start_receiver(self):
        self.receiver = self.launch(self.receiver_topo, side="receiver", workers=RECEIVER)
        return self.receiver

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sim.close()


@pytest.fixture
def link(tmp_path, brokers, launch):
    made = []

    def make(faults, receiver_later=False, **overrides):
        made.append(Link(tmp_path, brokers, launch, faults, receiver_later, **overrides))
        return made[-1]

    yield make
    for lk in made:
        lk.close()


