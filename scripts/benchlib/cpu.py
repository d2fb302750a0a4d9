"""CPU seconds (user + system) per process, read with psutil.

The system measured is a process tree (diode's supervisor and workers, or one baseline
process); the brokers, the bench's own meter and the bench's helpers (the UDP sink or replayer,
py-spy) are counted apart, so the table can say what the system itself cost."""

import psutil


def diode_label(p: psutil.Process) -> str:
    """A diode process's name from its title: `diode: sender/packer-0` -> sender/packer-0."""
    title = " ".join(p.cmdline()).strip()
    if title.startswith("diode: supervisor"):
        return "supervisor"
    if title.startswith("diode: "):
        return title[len("diode: "):].split()[0]
    return "launch"


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


class CpuWatch:
    """CPU seconds per process of the tree under `root_pid` (named by `label`), per broker and
    per helper (`apart`: name -> pids, more may be added), sampled on demand; a process that
    exits keeps its last sample. rebase() makes what was used so far not count."""

    def __init__(self, root_pid: int, label, brokers=(), apart: dict | None = None):
        self.root = psutil.Process(root_pid)
        self.label = label
        self.brokers = {b.name: b.proc.pid for b in brokers}
        self.apart = {name: list(pids) for name, pids in (apart or {}).items()}
        self.procs: dict[int, psutil.Process] = {}
        self.cpu: dict[int, tuple[str, float]] = {}     # tree pid -> (label, seconds)
        self.helpers: dict[tuple, float] = {}           # (group, name, pid) -> seconds
        self.me = psutil.Process()
        self.sample()  # the brokers and helpers count from now on, not from their start
        self.zero: dict = dict(self.helpers)

    def add_apart(self, name: str, pid: int) -> None:
        self.apart.setdefault(name, []).append(pid)

    def sample(self) -> None:
        try:
            found = [self.root] + self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for p in found:
            self.procs.setdefault(p.pid, p)
        for pid, p in self.procs.items():
            try:
                with p.oneshot():
                    self.cpu[pid] = (self.label(p), _cpu(p))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        helpers = [("brokers", name, pid) for name, pid in self.brokers.items()]
        helpers += [("apart", name, pid) for name, pids in self.apart.items() for pid in pids]
        helpers.append(("apart", "meter", self.me.pid))
        for key in helpers:
            try:
                self.helpers[key] = _cpu(self.me if key[2] == self.me.pid
                                         else psutil.Process(key[2]))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass

    def rss(self) -> dict:
        """Resident memory now (bytes) of every live process of the tree, by label."""
        self.sample()
        out: dict[str, int] = {}
        for pid, p in self.procs.items():
            try:
                name = self.label(p)
                out[name] = out.get(name, 0) + p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return dict(sorted(out.items()))

    def peak_rss(self) -> dict:
        """The most resident memory (bytes) every live process of the tree has had since it
        started (VmHWM of /proc/PID/status, Linux), by label."""
        self.sample()
        out: dict[str, int] = {}
        for pid, p in self.procs.items():
            try:
                name = self.label(p)
                with open(f"/proc/{pid}/status") as f:
                    kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
                out[name] = out.get(name, 0) + 1024 * kib
            except (OSError, StopIteration, psutil.NoSuchProcess, psutil.AccessDenied,
                    psutil.ZombieProcess):
                pass
        return dict(sorted(out.items()))

    def rebase(self) -> None:
        """From now on: CPU used so far by every process seen is not counted."""
        self.sample()
        self.zero = {("tree", pid): sec for pid, (_, sec) in self.cpu.items()}
        self.zero.update(self.helpers)

    def snapshot(self) -> dict:
        """CPU seconds so far: per process of the tree (by label), per broker, per helper."""
        self.sample()
        per_process: dict[str, float] = {}
        for pid, (name, sec) in self.cpu.items():
            per_process[name] = per_process.get(name, 0.0) + sec - self.zero.get(("tree", pid), 0)
        out = {"per_process": dict(sorted(per_process.items())), "brokers": {}, "apart": {}}
        for (group, name, pid), sec in self.helpers.items():
            zero = self.zero.get((group, name, pid), 0.0)
            out[group][name] = out[group].get(name, 0.0) + sec - zero
        return out
