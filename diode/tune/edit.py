"""The topology change `diode tune` proposes, as the file's own text: each stage's `instances`,
`cpus` and `pin.per.instance` set under sender.stages / receiver.stages, everything else
(comments, order, flow or block style) kept as it was, through ruamel.yaml's round trip.
`diff` shows it; `write` replaces the file atomically."""

import difflib
import io
from pathlib import Path

from diode.runtime import files
from diode.runtime.topology import PIPELINES, SIDES


def stage_settings(instances: int, cores: list) -> dict:
    """A stage's settings for a plan: one core per instance when they differ."""
    distinct = sorted(set(cores))
    out = {"instances": instances, "cpus": distinct if len(distinct) > 1 else distinct[:1]}
    if instances > 1 and len(distinct) > 1:
        out["cpus"] = list(cores)
        out["pin.per.instance"] = True
    return out


def proposed_text(text: str, stages: dict) -> str:
    """`text` (a topology file) with the stages set as in `stages`
    ({side: {stage: {"instances", "cpus", "pin.per.instance"?}}}); a setting the plan does
    not need (pin.per.instance on a single instance) is taken out."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 100
    yaml.indent(**indentation(text))
    data = yaml.load(text) or CommentedMap()
    for side in SIDES:
        if not stages.get(side):  # (a side not planned, or where nothing fits)
            continue
        if data.get(side) is None:
            data[side] = CommentedMap()
        section = data[side]
        if section.get("stages") is None:
            section["stages"] = CommentedMap()
        for name in PIPELINES[side]:
            want = stages[side].get(name)
            if want is None:
                continue
            current = section["stages"].get(name)
            if current is None:
                current = CommentedMap()
                current.fa.set_flow_style()  # as the demo writes them: {instances: 1}
                section["stages"][name] = current
            current["instances"] = want["instances"]
            cpus = CommentedSeq(want["cpus"])
            cpus.fa.set_flow_style()
            current["cpus"] = cpus
            if want.get("pin.per.instance"):
                current["pin.per.instance"] = True
            elif "pin.per.instance" in current:
                del current["pin.per.instance"]
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def indentation(text: str) -> dict:
    """How the file indents (ruamel.yaml's mapping, sequence, offset), read off its lines:
    mappings by their first nested key, block sequences by the first dash under a key."""
    mapping, offset = None, None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for above, line in zip(lines, lines[1:]):
        if not above.rstrip().endswith(":"):
            continue
        parent = len(above) - len(above.lstrip())
        indent = len(line) - len(line.lstrip())
        if indent <= parent:
            continue
        if line.lstrip().startswith("- "):
            offset = indent - parent if offset is None else offset
        elif mapping is None:
            mapping = indent - parent
    mapping = mapping or 2
    offset = offset if offset is not None else 0
    return {"mapping": mapping, "sequence": offset + 2, "offset": offset}


def diff(path, old: str, new: str) -> str:
    """A unified diff of the file's text, as `diff -u` shows it."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        f"{path}", f"{path} (proposed)"))


def write(path, text: str) -> None:
    """Replace the file with `text` atomically, keeping its mode."""
    files.replace(path, text, sync=False, mode=Path(path).stat().st_mode & 0o7777)
