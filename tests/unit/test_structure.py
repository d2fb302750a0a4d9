"""The layout's promises, read from the source with ast: stages share code only through diode's
rooms (no stage imports another; a mode of a stage, run in its place, extends it),
diode.kafka.maven is a leaf, and no two of diode's modules import each other at module level (a
cycle makes the import order decide what works), and every header and event diode writes to
Kafka is built in one module, diode.kafka.messages: no other module of diode/ or stages/ spells a
header's name in a (name, value) pair, nor an event's field names as the keys of a dict or the
keywords of a call (Event.build's), so that a new copy of a definition fails here before it
drifts from the docs and the readers."""

import ast
import functools
from pathlib import Path

from diode.kafka import messages

ROOT = Path(__file__).parents[2]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> dict:
    """name -> parsed module, for every module of `package` (a top-level folder)."""
    return {_module_name(p): _tree(p) for p in sorted((ROOT / package).rglob("*.py"))}


@functools.cache
def _tree(path: Path) -> ast.AST:
    """A module's syntax tree, parsed once for all the checks here."""
    return ast.parse(path.read_text(), str(path))


def _imported(tree: ast.AST, module: str, known, module_level: bool) -> set:
    """The modules of `known` that `tree` imports (inside functions too unless
    `module_level`): `from a.b import c` names a.b.c when that is a module, else a.b."""

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if module_level and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".")[:-child.level]
                    base = ".".join(package + ([base] if base else []))
                for alias in child.names:
                    yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            yield from visit(child)

    found = set()
    for name in visit(tree):
        while name and name not in known:  # (import a.b.c names the module a.b.c)
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


# A stage run in another's place, a mode of the same stage type, extends it (and only it).
MODES = {"stages.kafka_resender": "stages.kafka_reader"}


def test_no_stage_imports_another_stage():
    stages = _modules("stages")
    for name, tree in stages.items():
        others = _imported(tree, name, stages, module_level=False) - {"stages", MODES.get(name)}
        assert not others, f"{name} imports {sorted(others)}: what two stages share belongs " \
                           "in diode (runtime, link, kafka, accounting), not in a stage"


def test_the_maven_cache_is_a_leaf():
    modules = _modules("diode")
    assert _imported(modules["diode.kafka.maven"], "diode.kafka.maven", modules,
                     module_level=False) <= {"diode", "diode.errors"}


def test_no_import_cycle_among_diodes_modules():
    modules = _modules("diode")
    edges = {name: _imported(tree, name, modules, module_level=True)
             for name, tree in modules.items()}
    done: set = set()

    def cycle_from(name, path):
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        for imported in sorted(edges[name]):
            found = cycle_from(imported, path + [name])
            if found:
                return found
        done.add(name)
        return None

    for name in sorted(edges):
        cycle = cycle_from(name, [])
        assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_see_imports():
    """The parser above finds what it must (a test of the test)."""
    known = {"diode", "diode.a", "diode.a.b", "stages.x"}
    tree = ast.parse("import diode.a.b\nfrom diode.a import b\nfrom diode import a\n"
                     "def f():\n    from stages.x import y\n")
    assert _imported(tree, "m", known, module_level=True) == {"diode.a.b", "diode.a"}
    assert _imported(tree, "m", known, module_level=False) == {"diode.a.b", "diode.a",
                                                               "stages.x"}


# -- what crosses to Kafka is built in diode.kafka.messages only --------------------------------

THE_MODULE = ROOT / "diode" / "kafka" / "messages.py"

# The fields of the events, as dict keys or keywords: their camelCase names (lowercase words such
# as topic, partition or reason are every report's), and the heartbeat's lastSent fields.
EVENT_FIELDS = frozenset(
    n for e in (*messages.MISSING_RECORDS, messages.AUDIT, messages.HEARTBEAT, messages.DIGEST,
                messages.GROUP_CHECKPOINT) for n in e.names if n != n.lower()) | {
    "chainStart", "sourceEnd"}
# ...of which these are also the columns and fields of reports (a source partition's name in the
# audits', a ticket's times in `diode tickets --json`): a dict keyed by them alone is a report.
REPORT_FIELDS = frozenset({messages.SOURCE_TOPIC, messages.SOURCE_PARTITION,
                           messages.SOURCE_TOPIC_ID, "topicId", "openedAt", "closedAt"})


def _built_modules():
    for path in sorted([*(ROOT / "diode").rglob("*.py"), *(ROOT / "stages").rglob("*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if path != THE_MODULE:
            yield name, _tree(path)


def _text(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return node.value.decode() if isinstance(node.value, bytes) else node.value
    return None


def offences(name: str, tree: ast.AST) -> list[str]:
    """Where `tree` builds a header or an event itself."""
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first = node.elts[0]
            if _text(first) in messages.HEADER_NAMES or (
                    isinstance(first, ast.Attribute) and first.attr.endswith("HEADER")):
                found.append(f"{where}: header {ast.unparse(first)} built")
        elif isinstance(node, ast.Dict):
            keys = {_text(k) for k in node.keys} & EVENT_FIELDS
            if keys - REPORT_FIELDS:
                found.append(f"{where}: event dict with {sorted(keys)}")
        elif isinstance(node, ast.Call):
            keys = {k.arg for k in node.keywords} & EVENT_FIELDS
            if keys:
                found.append(f"{where}: event built with {sorted(keys)}")
    return found


def test_headers_and_events_are_built_only_in_diode_kafka_messages():
    found = [o for name, tree in _built_modules() for o in offences(name, tree)]
    assert not found, "build these through diode.kafka.messages:\n" + "\n".join(found)


def test_the_check_sees_each_way_of_building_them():
    """The check finds what it is for: a provenance pair, a ticket header, an event's dict and
    an Event.build call; and passes what is not one (an audit's report of a source partition)."""
    source = '''
h = [("sourceOffset", b"%d" % o), (messages.TICKET_HEADER, t)]
e = {"type": "missing", "sourceTopic": t, "firstOffset": 1}
d = DIGEST.build(sourceTopic=t, sentAt=1)
report = {"sourceTopic": t, "sourcePartition": p, "records": 3}
'''
    found = offences("x.py", ast.parse(source))
    assert sorted(f.split(":")[1] for f in found) == ["2", "2", "3", "4"], found
