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


LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors_of(path: Path) -> set:
    """The anchors a renderer gives a Markdown file's headings (GitHub's rule: lower case,
    punctuation dropped, spaces to hyphens; repeats get -1, -2 ...)."""
    seen: dict = {}
    out = set()
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_in_the_docs_resolves():
    links = 0
    broken = []
    for path in LINKED:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            links += 1
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)} -> {target}"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
                broken.append(f"{where}: no such heading")
    assert links > 20  # the finder finds them
    assert not broken, broken


def test_the_code_cites_the_design_in_the_project():
    """The design the code cites is docs/design.md, which is in the repository."""
    assert (ROOT / "docs" / "design.md").is_file()
    cited_elsewhere = [str(p.relative_to(ROOT)) for room in ("diode", "stages", "tests", "scripts")
                       for p in (ROOT / room).rglob("*.py")
                       if "DESIGN.md" in p.read_text() and p.name != "test_docs.py"]
    assert not cited_elsewhere, cited_elsewhere


def test_every_block_of_the_runbooks_is_marked_and_every_diode_command_parses():
    """The runbooks' structure, as tests/integration/test_runbooks.py reads it to run them:
    every block says where it runs and what it is, every block not run says why, and every
    `diode` command of the page parses."""
    import shlex
    from tests.integration.test_runbooks import blocks, commands, parses

    found = blocks()
    assert {b.kind for b in found} == {"commands", "topology", "log"}
    assert all(b.not_run.strip() for b in found if b.not_run is not None)
    parsed = 0
    for b in found:
        for command, _ in commands(b) if b.kind == "commands" else ():
            argv = shlex.split(command.removeprefix("sudo "))
            if Path(argv[0]).name == "diode":
                parses(argv[1:])
                parsed += 1
    assert parsed >= 12, parsed
