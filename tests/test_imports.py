"""The package's imports run one way: models/data → objectives → methods → runtime → jobs/CLI, with no cycle.

Every ``import`` is counted, including those inside functions: a function-level import only delays a cycle to the
first call, it does not remove it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import raydistill

PACKAGE_DIR = Path(raydistill.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from a.b import c`` counts a.b.c when c is a module, else a.b)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_package_has_no_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (counting function-level imports):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# The floors, lowest first: a module imports only its own floor and the ones below it. runtime/ is split by what its
# parts do, and each part is a floor of its own (docs/architecture.md draws them).
FLOORS = [
    {"raydistill", "argtypes", "fileio", "nested", "cputime", "durations", "shipped"},
    {"data", "augment", "wordnet", "models"},
    {"config"},
    {"evaluation", "objectives"},
    {"methods"},
    {"runtime.teachers"},
    {"runtime.engine"},
    {"runtime.jobs"},
    {"runtime.tenc"},
    {"runtime.tune"},
    {"runtime", "runtime.entry"},
    {"ship"},
    {"cli"},
]


def _unit(module: str) -> str:
    """raydistill.runtime.engine.learner -> runtime.engine; raydistill.models.registry -> models."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "runtime":
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else parts[0]


def _floor(module: str) -> int:
    unit = _unit(module)
    return next(index for index, floor in enumerate(FLOORS) if unit in floor)


def test_every_module_sits_on_a_floor():
    assert [module for module in import_graph() if not any(_unit(module) in floor for floor in FLOORS)] == []


def test_lower_floors_never_import_higher_ones():
    """models/data import no config, config no objective or method, methods nothing of runtime/, and inside
    runtime/ teachers < engine < jobs < tenc < tune < entry (imports inside functions count too)."""
    wrong = [(module, target) for module, targets in import_graph().items() for target in targets
             if _floor(target) > _floor(module)]
    assert not wrong, "imports against the floors: " + ", ".join(f"{m} -> {t}" for m, t in sorted(wrong))


def test_the_engine_imports_nothing_private_of_ray_train_or_data():
    """The training runtime uses Ray's public API: no ``ray.*._internal`` module is imported (a logger's name string
    is no import)."""
    private = []
    for path in sorted((PACKAGE_DIR / "runtime" / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            private += [f"{path.name}:{node.lineno} {name}" for name in names
                        if name.split(".")[0] == "ray" and "_internal" in name.split(".")]
    assert private == []


def _code_words(path: Path) -> list[tuple[int, str]]:
    """(line, word) of the identifiers and string literals of ``path``: no comment, no docstring."""
    import io
    import re
    import tokenize

    tree = ast.parse(path.read_text(), str(path))
    docstrings = {node.body[0].value.lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                  and isinstance(node.body[0].value.value, str)}
    words = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NAME:
            words += [(token.start[0], part) for part in token.string.lower().split("_")]
        elif token.type == tokenize.STRING and token.start[0] not in docstrings:
            words += [(token.start[0], word) for word in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)*", token.string.lower())]
    return words


def test_the_engine_knows_no_method_by_name():
    """What a method needs beyond its loss (the teacher queues, the projection's start) lives in hooks its spec
    declares (methods/hooks.py); the engine's code names no method and none of what the hooks hold."""
    from raydistill.methods import METHODS

    named = set(METHODS) | {"queue", "queues", "projection"}
    found = [f"{path.name}:{line} {word}" for path in sorted((PACKAGE_DIR / "runtime" / "engine").glob("*.py"))
             for line, word in _code_words(path) if word in named]
    assert found == []


def test_the_method_name_scan_sees_code_and_skips_prose(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""ConGen\'s queue."""\n# the queue\nqueue_size = 1\nname = "sct-distill"\n')
    assert [word for _, word in _code_words(sample) if word in {"queue", "sct-distill", "congen"}] == \
        ["queue", "sct-distill"]
