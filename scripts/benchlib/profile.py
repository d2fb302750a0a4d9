"""--profile: py-spy on every diode worker for the measured part of a run.

Each worker gets `py-spy record --pid PID --rate 100 --format raw`, started as soon as the
worker appears and stopped (SIGINT: py-spy writes its file) when the run is measured. The raw
file is collapsed stacks, one `frame;frame;...;leaf COUNT` line per stack, which flamegraph.pl
and speedscope.app open as they are; a speedscope JSON is written beside it. Self time is what
the leaf frames add up to, summed per stage over its instances.
"""

import json
import os
import re
import shutil
import signal

import psutil

from .cpu import diode_label
from .resources import REPO, log

RATE = 100
TOP = 10


def py_spy() -> str | None:
    venv = REPO / ".venv" / "bin" / "py-spy"
    return str(venv) if venv.exists() else shutil.which("py-spy")


class Profiler:
    """py-spy for every diode worker under a process tree; files named PREFIX-SIDE-STAGE-N."""

    def __init__(self, bench, prefix: str, cpu=None):
        self.b = bench
        self.prefix = prefix
        self.cpu = cpu  # its CpuWatch: py-spy's CPU is counted apart
        self.exe = py_spy()
        self.spies: dict[int, tuple] = {}  # worker pid -> (label, raw file, py-spy Popen)

    def watch(self, root_pid: int) -> None:
        """Start py-spy on every worker of the tree not profiled yet."""
        try:
            kids = psutil.Process(root_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in kids:
            if p.pid in self.spies:
                continue
            try:
                label = diode_label(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if label in ("launch", "supervisor"):
                continue  # not yet a worker (its title comes after the fork), or not one
            name = label.replace("/", "-")
            if any(lab == label for lab, _, _ in self.spies.values()):
                name += f"-pid{p.pid}"  # a restarted worker
            raw = os.path.join(self.b.profile_dir, f"{self.prefix}-{name}.txt")
            spy = self.b.res.popen([self.exe, "record", "--pid", str(p.pid), "--rate", str(RATE),
                                    "--format", "raw", "-o", raw],
                                   log_path=os.path.join(self.b.work, "py-spy.log"))
            self.spies[p.pid] = (label, raw, spy)
            if self.cpu is not None:
                self.cpu.add_apart("py-spy", spy.pid)

    def stop(self) -> dict:
        """Stop every py-spy (it writes its file) and summarise: per stage, samples and the top
        frames by self time."""
        for _, _, spy in self.spies.values():
            if spy.poll() is None:
                spy.send_signal(signal.SIGINT)
        for _, _, spy in self.spies.values():
            self.b.res.stop_proc(spy, 20, signal.SIGINT)
        stages: dict[str, dict] = {}
        files = []
        for label, raw, _ in self.spies.values():
            if not os.path.exists(raw):
                log(f"py-spy wrote no profile for {label} ({raw})")
                continue
            stacks = read_collapsed(raw)
            write_speedscope(stacks, raw[:-len(".txt")] + ".speedscope.json", label)
            files.append(raw)
            stage = re.sub(r"-\d+$", "", label)  # sender/packer-1 -> sender/packer
            s = stages.setdefault(stage, {"samples": 0, "self": {}})
            s["samples"] += sum(stacks.values())
            for stack, n in stacks.items():
                leaf = short_frame(stack.rsplit(";", 1)[-1])
                s["self"][leaf] = s["self"].get(leaf, 0) + n
        return {"run": self.prefix, "files": sorted(files), "stages": {
            stage: {"samples": s["samples"],
                    "top_self": sorted(s["self"].items(), key=lambda kv: -kv[1])[:TOP]}
            for stage, s in sorted(stages.items())}}


def read_collapsed(path: str) -> dict:
    """py-spy's raw format: `frame;frame;...;leaf COUNT` per line -> {stack: count}."""
    out: dict[str, int] = {}
    with open(path, errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                out[stack] = out.get(stack, 0) + int(count)
    return out


def short_frame(frame: str) -> str:
    """`func (/long/path/pkg/mod.py:123)` -> `func (pkg/mod.py)`: one entry per function."""
    m = re.fullmatch(r"(.*) \((.*?)(?::\d+)?\)", frame)
    if not m:
        return frame
    func, path = m.groups()
    return f"{func} ({'/'.join(path.split('/')[-2:])})"


def write_speedscope(stacks: dict, path: str, name: str) -> None:
    """The same samples as a speedscope file (https://www.speedscope.app)."""
    frames, index, samples, weights = [], {}, [], []
    for stack, n in stacks.items():
        ids = []
        for frame in stack.split(";"):
            if frame not in index:
                index[frame] = len(frames)
                frames.append({"name": frame})
            ids.append(index[frame])
        samples.append(ids)
        weights.append(n)
    doc = {"$schema": "https://www.speedscope.app/file-format-schema.json",
           "shared": {"frames": frames}, "name": name, "exporter": "scripts/bench",
           "profiles": [{"type": "sampled", "name": name, "unit": "none", "startValue": 0,
                         "endValue": sum(weights), "samples": samples, "weights": weights}]}
    with open(path, "w") as f:
        json.dump(doc, f)
