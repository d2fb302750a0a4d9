"""The pipeline's wiring, written once: the processes the supervisor forks (`plan`, one
WorkerSpec per stage instance, with its CPUs), which queue each stage binds and which queues it
connects to, by name, and their ZeroMQ addresses (`endpoint`). The stages open their sockets from
it (StageContext.bound and peers), `diode check` prints it, and the stage tests feed stages
through it. The settings it reads are diode.runtime.topology's.

Who binds: the receiving end of every queue (a stage's input, a reader's acknowledgements, the
UDP reader's control queue), so a restarted worker comes back at the same ipc path and its peers
reconnect by themselves (diode.runtime.transport).
"""

from dataclasses import dataclass

from diode.runtime.topology import PIPELINES, SIDES, Topology


# -- the plan: processes and their CPUs --------------------------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    side: str
    stage: str
    index: int
    cpus: tuple

    @property
    def name(self) -> str:
        return f"{self.side}/{self.stage}-{self.index}"


def plan(t: Topology, sides=SIDES) -> list[WorkerSpec]:
    """Every process the supervisor forks, in data-flow order per side."""
    specs = []
    for side in sides:
        for stage in PIPELINES[side]:
            s = t.stage(side, stage)
            for i in range(s.instances):
                cpus = (s.cpus[i % len(s.cpus)],) if s.pin_per_instance and s.cpus \
                    else tuple(s.cpus)
                specs.append(WorkerSpec(side, stage, i, cpus))
    return specs


# -- the queues between them -------------------------------------------------------------------

def endpoint(run_dir: str, side: str, stage: str, index: int, purpose: str = "in") -> str:
    """A queue's ZeroMQ address: ipc in the run directory; inproc when run_dir is "inproc"
    (stage tests drive a stage in one process with in-memory sockets)."""
    if run_dir == "inproc":
        return f"inproc://{side}-{stage}-{index}.{purpose}"
    return f"ipc://{run_dir}/{side}-{stage}-{index}.{purpose}"


# stage -> (the queues it binds, by purpose; {name: (stage, purpose)} of the queues it
# connects to, every instance of that stage)
QUEUES = {
    "kafka_reader": (("acks",), {"out": ("packer", "in")}),
    "packer": (("in",), {"out": ("udp_sender", "in"), "acks": ("kafka_reader", "acks")}),
    "udp_sender": (("in",), {"acks": ("kafka_reader", "acks")}),
    "udp_reader": (("control",), {"out": ("unpacker", "in")}),
    "unpacker": (("in",), {"out": ("kafka_writer", "in"),
                           "replay": ("udp_reader", "control")}),
    "kafka_writer": (("in",), {"replay": ("udp_reader", "control")}),
}


def bound(run_dir: str, spec, purpose: str = "in") -> str:
    """The endpoint a worker binds for `purpose`."""
    if purpose not in QUEUES[spec.stage][0]:
        raise KeyError(f"{spec.stage} binds no {purpose!r} queue")
    return endpoint(run_dir, spec.side, spec.stage, spec.index, purpose)


def peers(t, run_dir: str, spec, name: str) -> list[str]:
    """The endpoints of every instance of the stage a worker's `name` queue reaches, in
    instance order."""
    stage, purpose = QUEUES[spec.stage][1][name]
    return [endpoint(run_dir, spec.side, stage, i, purpose)
            for i in range(t.stage(spec.side, stage).instances)]


def describe(t, spec, run_dir: str) -> tuple[list[str], list[str]]:
    """(what a worker binds, what it connects to), the link and Kafka included, for
    `diode check`."""
    binds = [bound(run_dir, spec, p) for p in QUEUES[spec.stage][0]]
    connects = [e for name in QUEUES[spec.stage][1] for e in peers(t, run_dir, spec, name)]
    if spec.stage == "udp_sender":
        connects.append(f"udp://{t.link.host}:{t.link.port}")
    elif spec.stage == "udp_reader":
        binds.insert(0, f"udp://{t.link.bind_address}:{t.link.port}")
    elif spec.stage == "kafka_writer":
        connects.insert(0, t.receiver.kafka.get("bootstrap.servers", "?"))
    elif spec.stage == "kafka_reader":
        connects.insert(0, t.sender.kafka.get("bootstrap.servers", "?"))
    return binds, connects
