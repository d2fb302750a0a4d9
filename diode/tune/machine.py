"""What `diode tune` reads off this machine: its cores and how busy they are, where the NIC's
receive interrupts land, the network sysctls and the qdisc pacing meets; and which of them are
too small for a rate. Facts it cannot read are left out (the report says so), never guessed."""

import os
import subprocess

from diode.tune.decide import Machine

SYSCTLS = ("net.core.rmem_max", "net.core.wmem_max", "net.core.netdev_max_backlog")


def irq_cores(device: str, interrupts: str, virtio: str = "") -> tuple:
    """The cores that took the receive interrupts of `device` (its lines in /proc/interrupts,
    by name or, for virtio, by its virtioN name), from the counts: where they actually land."""
    lines = interrupts.splitlines()
    if not lines or not device:
        return ()
    cpus = [int(c[3:]) for c in lines[0].split()]
    names = tuple(n for n in (device, virtio) if n)
    cores = set()
    for line in lines[1:]:
        fields = line.split()
        if not fields or not fields[0].rstrip(":").isdigit():
            continue
        label = fields[-1]
        if not label.startswith(names) or any(w in label for w in ("config", "tx", "output")):
            continue
        for cpu, count in zip(cpus, fields[1:1 + len(cpus)]):
            if count.isdigit() and int(count) > 0:
                cores.add(cpu)
    return tuple(sorted(cores))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def read_machine(host: str, sample_seconds: float = 0.5) -> tuple[Machine, dict]:
    """This machine as `diode tune` sees it: the cores this process may use, how busy each is
    (others' load over `sample_seconds`), the cores of the NIC's receive interrupts for the
    device the link's host is reached by, and the network sysctls. Facts it cannot read are
    left out (the report says so), never guessed."""
    import psutil
    from diode.link import pacing
    cores = tuple(sorted(os.sched_getaffinity(0)))
    percent = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    busy = {c: percent[c] / 100 for c in cores if c < len(percent)}
    facts = {"logical_cores": len(cores), "physical_cores": psutil.cpu_count(logical=False),
             "busy": busy, "device": None, "qdisc": None, "irq_cores": (),
             "sysctl": {name: _sysctl(name) for name in SYSCTLS}}
    try:
        egress = pacing.probe_egress(host)
        facts.update(device=egress.device, qdisc=egress.qdisc, mtu=egress.mtu)
    except (OSError, ValueError, LookupError, subprocess.SubprocessError) as exc:
        facts["device_error"] = str(exc)
    device = facts["device"] or ""
    virtio = os.path.basename(os.path.realpath(f"/sys/class/net/{device}/device")) \
        if device else ""
    facts["irq_cores"] = irq_cores(device, _read("/proc/interrupts"),
                                   virtio if virtio.startswith("virtio") else "")
    return Machine(cores, busy, facts["irq_cores"]), facts


def _sysctl(name: str) -> int | None:
    text = _read("/proc/sys/" + name.replace(".", "/")).strip()
    return int(text) if text.isdigit() else None


def sysctl_advice(side: str, bytes_per_second: float, datagrams_per_second: float,
                  current: dict) -> list:
    """(sysctl, value now, value to set, why) for each one too small for the rate:
    the receiver's socket buffer holds a quarter second of the link (a reader held up that long
    loses nothing), the sender's 50 ms, the device backlog 10 ms of datagrams."""
    wanted = {"net.core.netdev_max_backlog": (max(1000, int(datagrams_per_second * 0.01)),
                                              "10 ms of datagrams queued per core")}
    if side == "receiver":
        wanted["net.core.rmem_max"] = (max(4 << 20, int(bytes_per_second * 0.25)),
                                       "a quarter second of the link in the socket buffer")
    else:
        wanted["net.core.wmem_max"] = (max(1 << 20, int(bytes_per_second * 0.05)),
                                       "50 ms of the link in the socket buffer")
    return [(name, current.get(name), value, why) for name, (value, why) in wanted.items()
            if current.get(name) is not None and current[name] < value]




def pacing_advice(facts: dict, rate_mbps: float) -> str | None:
    """What to change so the sender's pacing is the kernel's (fq) rather than a sleeping loop:
    None when the link is unpaced, fq is there, or the device is unknown."""
    device, qdisc = facts.get("device"), facts.get("qdisc")
    if not rate_mbps or not device or qdisc in (None, "fq"):
        return None
    return (f"tc qdisc replace dev {device} root fq  (now {qdisc}: the sender paces "
            f"{rate_mbps:g} Mbit/s with a sleeping loop instead of the kernel)")
