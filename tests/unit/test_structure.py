"""The layout's promises, read from the source with ast: stages share code only through diode's
rooms (no stage imports another; a mode of a stage, run in its place, extends it),
diode.kafka.maven is a leaf, and no two of diode's modules import each other at module level (a
cycle makes the import order decide what works)."""

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> dict:
    """name -> parsed module, for every module of `package` (a top-level folder)."""
    return {_module_name(p): ast.parse(p.read_text(), str(p))
            for p in sorted((ROOT / package).rglob("*.py"))}


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
