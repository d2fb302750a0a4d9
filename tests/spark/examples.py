"""The `diode verify` examples of README.md and docs/, as a reader would run them: the lines of
a code block that start with `$ ` and run `diode verify` (continuation lines joined), but in a
block marked as not run (`<!-- ...; not run: why -->`, docs/runbooks.md). They are
written for the demo (`./scripts/demo`: source 127.0.0.1:19092, destination 127.0.0.1:29092);
a test runs them against its own brokers, with only the ports changed."""

import shlex
import sys

from tests.conftest import ROOT

DEMO_SOURCE, DEMO_DESTINATION = "127.0.0.1:19092", "127.0.0.1:29092"


def examples() -> list:
    """[(file name, argv as printed)] of every `$ … diode verify …` line."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        command, not_run, skipping = None, False, False
        for line in path.read_text().splitlines():
            if line.startswith("<!--"):  # a block marked "not run: why" (docs/runbooks.md)
                not_run = "not run:" in line
            elif line.startswith("```"):
                skipping, not_run = not skipping and not_run, False
            if skipping:
                continue
            if command is not None:
                command += " " + line.strip()
            elif line.startswith("$ "):
                command = line[2:].strip()
            if command is not None and not command.endswith("\\"):
                argv = shlex.split(command)
                if len(argv) > 1 and argv[0].endswith("diode") and argv[1] == "verify":
                    found.append((path.name, argv))
                command = None
            elif command is not None:
                command = command[:-1].rstrip()
    return found


def for_brokers(argv: list, source: str, destination: str) -> list:
    """`argv` with the demo's addresses replaced by these brokers', and the `diode` it names
    run as this Python's (the checkout's .venv/bin/diode where it is one)."""
    swapped = [a.replace(DEMO_SOURCE, source).replace(DEMO_DESTINATION, destination)
               for a in argv[1:]]
    program = ROOT / argv[0]
    return ([str(program)] if program.is_file() else [sys.executable, "-m", "diode"]) + swapped
