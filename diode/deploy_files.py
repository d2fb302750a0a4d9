"""`diode deploy-files [--to DIR] [--force]`: the deployment files shipped inside the package,
and where each is installed.

The repository's deploy/ directory (the systemd unit, the sysctl file, the Prometheus rules, the
Grafana dashboard) is in the wheel as package data (diode/deploy, a link to deploy/ in the
checkout: one copy), so a host installed from the wheel alone has them. Without `--to` the
command lists them; with it, it writes them under DIR as deploy/ lays them out, and says where
each goes on the host. A file already in DIR that differs from the shipped one is left as it is
and nothing is written, unless `--force`: it may be an operator's edit.
"""

import fnmatch
import sys
from importlib import resources
from pathlib import Path, PurePath

from diode.errors import DiodeError
from diode.runtime import files

# (pattern of a path under deploy/, the directory it is installed in on a host or None, what to
# say of it, what to run then), the first that matches
DESTINATIONS = (
    ("systemd/*.service", "/etc/systemd/system", "", "systemctl daemon-reload"),
    ("sysctl.d/*.conf", "/etc/sysctl.d", "", "sysctl --system"),
    ("prometheus/*.test.yml", None, "not installed: Prometheus' unit tests of the rules beside "
     "it", "promtool test rules {written}"),
    ("prometheus/*.yml", "/etc/prometheus", " (named in prometheus.yml's rule_files)",
     "promtool check rules {installed}"),
    ("grafana/*.json", None, "import it into Grafana (Dashboards, New, Import), or put it in a "
     "dashboard provider's directory", ""),
)


def shipped() -> dict:
    """Path under deploy/ ("systemd/diode@.service") -> the shipped file's bytes."""
    out = {}

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__":
                continue
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            else:
                out[f"{prefix}{child.name}"] = child.read_bytes()
    walk(resources.files("diode") / "deploy", "")
    return out


def destination(name: str, written: str | None = None) -> str:
    """Where the shipped file `name` goes on a host and what to run then (`written`: where it
    was written)."""
    for pattern, directory, note, then in DESTINATIONS:
        if fnmatch.fnmatch(name, pattern):
            installed = f"{directory}/{PurePath(name).name}" if directory else None
            said = f"install as {installed}{note}" if installed else note
            then = then.format(written=written or name, installed=installed)
            return f"{said}, then {then}" if then else said
    return "see docs/deploy.md"


def write(to: Path, force: bool = False) -> list[tuple[str, str]]:
    """Write every shipped file under `to`; [(path written, what happened)]. A file there that
    differs from the shipped one: DiodeError, nothing written, unless `force`."""
    found = shipped()
    there = {name: (to / name).read_bytes() for name in found if (to / name).is_file()}
    changed = [name for name, data in there.items() if data != found[name]]
    if changed and not force:
        raise DiodeError(f"{', '.join(str(to / n) for n in changed)}: differ from the shipped "
                         "file(s) (edited there?); nothing written. --force replaces them")
    done = []
    for name, data in found.items():
        path = to / name
        if there.get(name) == data:
            done.append((str(path), "unchanged"))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        files.replace(path, data, sync=False, mode=0o644)
        done.append((str(path), "replaced" if name in changed else "written"))
    return done


def main(args) -> int:
    if args.to is None:
        for name in shipped():
            print(f"{name}: {destination(name)}")
        print("(diode deploy-files --to DIR writes them there)", file=sys.stderr)
        return 0
    to = Path(args.to)
    for path, what in write(to, args.force):
        print(f"{what} {path}: {destination(str(Path(path).relative_to(to)), path)}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("deploy-files", help="the deployment files shipped in the package (the "
                       "systemd unit, sysctl file, Prometheus rules, Grafana dashboard): list "
                       "them and where each goes on a host, or write them out (--to)")
    p.add_argument("--to", metavar="DIR", help="write them under DIR, as deploy/ lays them "
                   "out, and say where each goes")
    p.add_argument("--force", action="store_true", help="replace files in DIR that differ from "
                   "the shipped ones (else nothing is written)")
    p.set_defaults(func=main)
