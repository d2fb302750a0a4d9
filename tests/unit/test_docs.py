"""The docs are true to the code: every `diode` command they show exists and answers --help,
every script they name is there to run."""

import re
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# words after "diode " in code that are not commands ("py-spy on every diode worker")
NOT_COMMANDS = {"worker"}


def code_of(path: Path) -> list[str]:
    text = path.read_text()
    return re.findall(r"```.*?```", text, re.S) + re.findall(r"`[^`\n]+`", text)


def documented_commands() -> dict:
    found: dict = {}
    for path in DOCS:
        for code in code_of(path):
            for m in re.finditer(r"(?:^|[\s/(`])diode ([a-z][a-z-]*)", code, re.M):
                found.setdefault(m.group(1), set()).add(path.name)
    return found


def cli_commands() -> set:
    from diode import cli
    return cli.commands(cli.build_parser())


def test_every_command_the_docs_show_exists_and_answers_help():
    commands = cli_commands()
    shown = documented_commands()
    assert {"launch", "check", "soak", "tune", "status", "verify", "import-properties"} <= \
        set(shown), shown  # the finder finds them
    unknown = {c: sorted(where) for c, where in shown.items()
               if c not in commands and c not in NOT_COMMANDS}
    assert not unknown, f"documented but not commands: {unknown}"
    for command in sorted(set(shown) & commands):
        r = subprocess.run([sys.executable, "-m", "diode", command, "--help"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage: diode" in r.stdout, (command, r.stderr)
    # and every command is documented somewhere
    assert commands <= set(shown), commands - set(shown)


def test_every_script_the_docs_name_is_there_to_run():
    named = {m for path in DOCS for code in code_of(path)
             for m in re.findall(r"\./scripts/([a-z][a-z_-]*)", code)}
    assert {"demo", "test", "bench", "tuning-figures"} <= named
    for script in named:
        path = ROOT / "scripts" / script
        assert path.is_file() and path.stat().st_mode & 0o111, script
