"""`diode import-properties`: reads the connector's files (diode.connect_import.properties),
maps them (.mapping), validates the topology with the settings registry, writes the password
into a file of its own (mode 0600, never into the topology) and the topology (.render) to a
file or stdout, and prints the notes and what was not mapped. Bad input is a PropertiesError:
exit 2 with the reason.
"""

import os
import sys
import textwrap
from pathlib import Path

from diode.connect_import.mapping import DEFAULT_PASSWORD_FILE, password, to_topology
from diode.connect_import.properties import (SIDE_OF, SINK, SOURCE, PropertiesError,
                                             assign_roles, read_config)
from diode.connect_import.render import grouped, render_yaml
from diode.runtime import files

def password_paths(output: str | None, option: str | None) -> tuple[Path, str]:
    """(where to write the password file, how the topology names it). The topology names it
    relative to its own directory (the output's, or this one when it goes to stdout)."""
    base = Path(output).resolve().parent if output else Path.cwd()
    if option is None:
        return base / DEFAULT_PASSWORD_FILE, DEFAULT_PASSWORD_FILE
    path = Path(option)
    if path.is_absolute():
        return path, option
    return path, os.path.relpath(path.resolve(), base)


def write_secret(path: Path, secret: str, force: bool) -> str:
    """Write `secret` to `path` with mode 0600 (through a new file, so never a moment with
    looser permissions); returns "written" or "unchanged". A file holding something else is
    replaced only with `force`."""
    if path.exists():
        try:
            held = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise PropertiesError(f"cannot read {path}: {exc.strerror}") from None
        if held == secret.encode():
            return "unchanged"
        if not force:
            raise PropertiesError(f"{path} exists and holds another password: give --force to "
                                  "replace it, or --password-file another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        files.replace(path, secret + "\n", sync=False, mode=0o600)
    except OSError as exc:
        raise PropertiesError(f"cannot write the password file {path}: {exc.strerror}") from None
    return "written"


def _wrap(text: str, hang: str) -> str:
    return "\n".join(textwrap.wrap(text, 100, subsequent_indent=hang, break_on_hyphens=False,
                                   break_long_words=False))


def run(args, stdout=None, stderr=None) -> int:
    """Read, map, validate, write the password file, print; PropertiesError on bad input."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    from diode.runtime import topology as topo
    from diode.errors import TopologyError

    def read(path, worker=False):
        return read_config(path, worker) if path else None

    if len(args.files) > 2:
        raise PropertiesError("give at most two files: the sink connector's and the source's")
    sink, source = assign_roles([read(p) for p in args.files], read(args.sink),
                                read(args.source))
    if args.output and Path(args.output).exists() and not args.force:
        raise PropertiesError(f"{args.output} exists: give --force to replace it")
    secret_path, secret_ref = password_paths(args.output, args.password_file)
    t, unmapped, notes = to_topology(
        sink, source, sink_worker=read(args.sink_worker, True),
        source_worker=read(args.source_worker, True), password_file=secret_ref, name=args.name)
    try:
        topo.from_dict(t, args.output or "<stdout>")
    except TopologyError as exc:
        raise PropertiesError(f"the topology made is not valid:\n{exc}") from None
    origins = [f"{role} connector ({side}, diode's {SIDE_OF[role]}): {cfg.path}"
               for role, side, cfg in ((SINK, "high side", sink), (SOURCE, "low side", source))
               if cfg is not None]
    text = render_yaml(t, unmapped, notes, origins)

    secret = password(sink, source)
    if secret is not None:
        done = write_secret(secret_path, secret, args.force)
        where = ("" if args.output or os.path.isabs(secret_ref) else
                 " (the topology names it relative to its own directory: keep the topology in "
                 "this one)")
        print(f"password: {'written to' if done == 'written' else 'already in'} {secret_path} "
              f"(mode 0600), named by security.password.file{where}", file=stderr)
    elif t["security"].get("password.file"):
        print(f"password: not written; put it in {secret_path} (mode 0600)", file=stderr)
    if args.output:
        try:
            files.replace(args.output, text, sync=False, mode=0o644)
        except OSError as exc:
            raise PropertiesError(f"cannot write {args.output}: {exc.strerror}") from None
        print(f"topology: written to {args.output}", file=stderr)
    else:
        stdout.write(text)
    for n in notes:
        print(_wrap(f"note: {n}", "  "), file=stderr)
    if unmapped:
        print(f"not mapped ({len(unmapped)} properties; listed at the top of the topology too):",
              file=stderr)
        for g in grouped(unmapped):
            print(_wrap(f"  {g}", "    "), file=stderr)
    return 0


def main(args) -> int:
    """`diode import-properties`: exit 0, or 2 with the reason on bad input."""
    try:
        return run(args)
    except PropertiesError as exc:
        print(f"diode import-properties: {exc}", file=sys.stderr)
        return 2


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import-properties", help="make a topology from the Confluent Data Diode connector's "
        "sink and/or source .properties (stdout); lists what cannot be mapped",
        description="Map the Confluent Data Diode connector's configuration to a diode "
        "topology. The sink connector (high side) becomes the sender, the source connector "
        "(low side) the receiver. Positional files are told apart by connector.class.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="the sink's and/or the source's .properties (or Connect REST JSON)")
    p.add_argument("--sink", metavar="FILE", help="the sink connector's configuration")
    p.add_argument("--source", metavar="FILE", help="the source connector's configuration")
    p.add_argument("--sink-worker", metavar="FILE", help="the high side's Connect worker "
                   "properties: bootstrap.servers and consumer.* settings")
    p.add_argument("--source-worker", metavar="FILE", help="the low side's Connect worker "
                   "properties: bootstrap.servers and producer.* settings")
    p.add_argument("-o", "--output", metavar="FILE", help="write the topology here instead of "
                   "stdout")
    p.add_argument("--password-file", metavar="PATH", help="where to write the password "
                   f"(mode 0600); default {DEFAULT_PASSWORD_FILE} beside the output, or here")
    p.add_argument("--force", action="store_true", help="replace an existing password file "
                   "holding another password, or an existing --output")
    p.add_argument("--name", default="diode", help="the topology's name (default diode)")
    p.set_defaults(func=main)
