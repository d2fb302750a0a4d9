"""The link's key rotated while records flow, as docs/runbooks.md ("Key rotation") tells an
operator: 1) the low side adds the next key and reloads (SIGHUP); 2) the high side makes it its
current key and restarts cleanly; 3) the low side makes it current, drops the old one and reloads.
The sender and the receiver run as separate launches, each with its own topology file and
password files. Every record produced arrives exactly once, the receiver rejects no datagram and
reports nothing missing, and the sender's restart is logged as a clean stop, never as a silent
link."""

import signal
import socket
import threading
import time

import yaml

from diode.runtime import launches
from tests.conftest import create_topic, free_port, produce, wait_for, write_topology
from tests.integration.test_durability import PARTITIONS, audit, written_some

CHUNK = 100  # records produced every 0.1 s


class Producing:
    """Records produced to the source in a thread, CHUNK every 0.1 s, until stop(); spread
    over the partitions evenly (a multiple of PARTITIONS per chunk)."""

    def __init__(self, bootstrap):
        self.bootstrap, self.produced = bootstrap, 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        next_at = time.monotonic()
        while not self.stopping.is_set():
            first = self.produced
            produce(self.bootstrap, "src", [{"value": b"r%06d" % i + b"." * 100,
                                             "partition": i % PARTITIONS}
                                            for i in range(first, first + CHUNK)])
            self.produced += CHUNK
            next_at += 0.1
            time.sleep(max(0.0, next_at - time.monotonic()))  # (pacing: 1 000 records/s)

    def stop(self) -> int:
        """Stop producing; how many records were produced in all."""
        self.stopping.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the producer did not stop"
        return self.produced


def side(tmp_path, name, src, dst, port):
    """One side's directory: its topology (on the link's `port`) and both keys' passwords."""
    d = tmp_path / name
    d.mkdir()
    for key in ("key0", "key1"):
        (d / f"{key}.password").write_text(f"the {key} password\n")
        (d / f"{key}.password").chmod(0o600)
    return write_topology(
        d, src.bootstrap, dst.bootstrap,
        link={"port": port}, security={"password.file": "key0.password", "key.id": 0},
        sender={"heartbeat.interval.ms": 500},
        receiver={"missing.records.topic": "missing", "reorder.wait.ms": 500,
                  "checkpoint.interval.ms": 500,
                  "stages": {"unpacker": {"instances": 2}, "kafka_writer": {"instances": 2}}})


def secure(topology, **security):
    """The operator's edit: the topology's security section becomes `security` (and the salt)."""
    data = yaml.safe_load(topology.read_text())
    data["security"] = {"salt": data["security"]["salt"], **security}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))


def reload(receiver, said: str, times: int = 1) -> None:
    """`systemctl reload`: SIGHUP to the receiver's supervisor, then until its log says `said`
    `times` more."""
    before = receiver.output().count(said)
    receiver.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: receiver.output().count(said) >= before + times, 30,
             f"{said!r} in the receiver's log\n{receiver.output()[-3000:]}")


def test_the_link_key_rotates_while_records_flow_losing_and_rejecting_nothing(
        tmp_path, brokers, launch):
    src, dst = brokers
    create_topic(src.bootstrap, "src", PARTITIONS)
    port = free_port(socket.SOCK_DGRAM)
    low, high = (side(tmp_path, name, src, dst, port) for name in ("receiver", "sender"))
    receiver = launch(low, side="receiver", workers=5)
    sender = launch(high, side="sender", workers=3)
    producing = Producing(src.bootstrap)
    written_some(receiver)

    # A reload that cannot be applied (a next key whose file is not there) changes nothing.
    secure(low, **{"password.file": "key0.password", "key.id": 0,
                   "next.password.file": "missing.password", "next.key.id": 1})
    reload(receiver, "keys not reloaded, the receiver still accepts key id 0")
    # 1) low side: the next key added, reloaded
    secure(low, **{"password.file": "key0.password", "key.id": 0,
                   "next.password.file": "key1.password", "next.key.id": 1})
    reload(receiver, "keyring rebuilt: accepting key ids 0 (current) and 1 (next)", times=2)
    # 2) high side: the next key made current, a clean restart
    secure(high, **{"password.file": "key1.password", "key.id": 1})
    assert sender.stop() == 0
    wait_for(lambda: "the sender stopped (clean stop)" in receiver.output(), 30,
             f"the sender's clean stop in the receiver's log\n{receiver.output()[-3000:]}")
    # (stopped longer than three heartbeat intervals: a silence the receiver would report)
    wait_for(lambda: receiver.metric("link_heartbeat_age_seconds", "kafka_writer") >= 2.0, 30,
             "two seconds without a heartbeat")
    sender.start()
    sender.wait_workers(3)
    sender.wait_ready(3)
    wait_for(lambda: "the sender is back" in receiver.output(), 30, "the sender back")
    sealed_with_0 = receiver.metric("records", "kafka_writer")
    wait_for(lambda: receiver.metric("records", "kafka_writer") > sealed_with_0 + 2 * CHUNK, 60,
             "records sealed with key 1 written")
    # 3) low side: the new key current, the old one dropped, reloaded
    secure(low, **{"password.file": "key1.password", "key.id": 1})
    reload(receiver, "keyring rebuilt: accepting key id 1", times=2)
    written = receiver.metric("records", "kafka_writer")
    wait_for(lambda: receiver.metric("records", "kafka_writer") > written + 2 * CHUNK, 60,
             "records written after the old key was dropped")
    total = producing.stop()

    a = audit(dst, total)
    out = receiver.output()
    assert not a.silent(total), f"lost: {a.summary(total)}\n{out[-5000:]}"
    assert a.duplicates == 0, f"written twice: {a.summary(total)}"
    assert not a.events, f"the missing-records topic holds {a.events[:5]}"
    rejected = {stage: receiver.metric("rejects", stage)
                for stage in ("udp_reader", "unpacker", "kafka_writer")}
    assert rejected == {"udp_reader": 0, "unpacker": 0, "kafka_writer": 0}, rejected
    assert "no heartbeat from the sender" not in out, out[-5000:]
    status = launches.read_status(str(receiver.run_dir))
    assert status["keys"] == {"current": 1, "accepted": [1]}
    assert "the key1 password" not in out and "the key0 password" not in out
    assert sender.stop() == 0 and receiver.stop() == 0
