"""The import graph of seq2seq/: every `seq2seq.*` import of every module (sub-packages included,
deferred imports inside functions and TYPE_CHECKING blocks too) goes to a module of the same or a
lower layer, and the graph has no cycle. The layers are the list in docs/DESIGN.md, which the
tests read; `python -m tests.test_imports` prints the graph as DESIGN.md draws it."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "seq2seq"
DESIGN = REPO / "docs" / "DESIGN.md"
# the fenced block after this line of DESIGN.md lists the layers, lowest first
MARKER = "<!-- layers: checked by tests/test_imports.py -->"
LAYER_LINE = re.compile(r"^(\d+) ([a-z ]+): (.+)$")


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The seq2seq modules that `name` imports anywhere in its file. `from a import b` counts
    as importing a.b when that is a module; importing a.b also runs package a's __init__, which
    counts too unless `name` is inside package a (then a is already being imported)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.update(
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            )
    targets = {m for m in found if m == "seq2seq" or m.startswith("seq2seq.")}
    parents = {p for m in targets for p in packages_of(m) if not f"{name}.".startswith(f"{p}.")}
    return (targets | parents) - {name}


def packages_of(module: str) -> list[str]:
    """The sub-packages above `module` whose __init__ importing it runs ("seq2seq.a.b" ->
    ["seq2seq.a"]); the root package's __init__ is empty and left out."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def documented_layers() -> list[tuple[str, list[str]]]:
    """(layer name, module names) from DESIGN.md's block, lowest layer first."""
    text = DESIGN.read_text(encoding="utf-8")
    assert MARKER in text, f"{DESIGN} has no {MARKER!r} line before its list of layers"
    block = text.split(MARKER, 1)[1].split("```", 2)[1]
    layers = []
    for line in block.splitlines()[1:]:  # the first line is the fence's language
        match = LAYER_LINE.match(line.strip())
        assert match, f"{DESIGN}: {line!r} is not `N name: module module ...`"
        assert int(match.group(1)) == len(layers) + 1, f"{DESIGN}: layers out of order at {line!r}"
        layers.append((match.group(2), match.group(3).split()))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int:
    """The index of `module`'s layer (a sub-package's __init__ by the package's name)."""
    short = module.removeprefix("seq2seq.")
    for index, (_, names) in enumerate(layers):
        if short in names:
            return index
    raise AssertionError(f"{module} is in no layer: add it to the list of layers in docs/DESIGN.md")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:  # on the current path: back to it is a cycle
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_root_package_imports_nothing_of_its_own() -> None:
    """Only seq2seq.mkl (torch-free: it must run before torch loads) and `from seq2seq import
    Translator`, deferred to first use (the module's __getattr__): importing the package imports
    no other module of its own (test_translator checks: no torch)."""
    allowed = {"seq2seq.mkl", "seq2seq.decode", "seq2seq.decode.translator"}
    assert import_graph()["seq2seq"] <= allowed
    top_level = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body
    imports = [node for node in top_level[1:] if isinstance(node, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(node) for node in imports] == ["from seq2seq.mkl import use_intel_path"]


def test_the_import_graph_has_no_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found() -> None:
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a", "b"}, "a": {"b"}, "b": set()}) is None


def test_no_module_imports_a_higher_layer() -> None:
    layers = documented_layers()
    graph = import_graph()
    upward = [
        f"{m} (layer {layers[layer_of(m, layers)][0]}) imports {t} "
        f"(layer {layers[layer_of(t, layers)][0]})"
        for m, targets in sorted(graph.items())
        if m != "seq2seq"
        for t in sorted(targets)
        if layer_of(t, layers) > layer_of(m, layers)
    ]
    assert not upward, "\n".join(upward)


def test_every_module_has_one_layer() -> None:
    layers = documented_layers()
    for module in module_files():
        if module != "seq2seq":
            layer_of(module, layers)  # raises for a module in no layer


def test_every_documented_module_exists() -> None:
    modules = {m.removeprefix("seq2seq.") for m in module_files()}
    listed = [n for _, names in documented_layers() for n in names]
    assert len(listed) == len(set(listed)), f"a module is listed twice in {DESIGN}"
    assert not set(listed) - modules, f"{DESIGN} lists modules that do not exist"


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


# the data-preparation and training stack, which translating never needs
PREPARATION = {
    "seq2seq.data.encode",
    "seq2seq.data.prepare",
    "seq2seq.data.prepared",
    "seq2seq.data.epochs",
    "seq2seq.train.corpus",
    "seq2seq.train.build",
    "seq2seq.train.trainer",
}


@pytest.mark.parametrize("entry", ["seq2seq.cli.translate", "seq2seq.decode.translator"])
def test_translation_imports_no_data_preparation(entry: str) -> None:
    assert not reachable(import_graph(), entry) & PREPARATION


def test_a_cycle_free_graph_reaches_what_it_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert reachable(graph, "a") == {"b", "c"}
    assert reachable(graph, "d") == {"a", "b", "c"}


def test_the_kernel_seam_has_no_leaks() -> None:
    """Outside seq2seq/kernels/, modules call the seam's API (the package) only, never one
    device's implementation."""
    leaks = [
        f"{m} imports {t}"
        for m, targets in sorted(import_graph().items())
        if not m.startswith("seq2seq.kernels")
        for t in sorted(targets)
        if t.startswith("seq2seq.kernels.")
    ]
    assert not leaks, "\n".join(leaks)


def test_the_package_needs_no_dev_dependency() -> None:
    """num2words (the dev extra) generates seq2seq/data/numbers/ in scripts/; the package never
    needs it."""
    for path in module_files().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "num2words" for n in names), path


@pytest.mark.parametrize(
    ("name", "source", "expected"),
    [
        (
            "seq2seq.fake",
            "from seq2seq.kernels import onednn",
            {"seq2seq.kernels.onednn", "seq2seq.kernels"},
        ),
        ("seq2seq.kernels.fake", "from seq2seq.kernels import onednn", {"seq2seq.kernels.onednn"}),
        (
            "seq2seq.fake",
            "def f():\n    from seq2seq.train import build",
            {"seq2seq.train.build", "seq2seq.train"},
        ),
        (
            "seq2seq.fake",
            "import seq2seq.train.trainer as t\nimport torch",
            {"seq2seq.train.trainer", "seq2seq.train"},
        ),
        ("seq2seq.kernels.fake", "from . import onednn", {"seq2seq.kernels.onednn"}),
        (
            "seq2seq.fake",
            "from .config.schema import Precision",
            {"seq2seq.config.schema", "seq2seq.config"},
        ),
    ],
    ids=["submodule", "inside-its-package", "deferred", "import-as", "relative", "relative-from"],
)
def test_imports_are_found_however_written(
    tmp_path: Path, name: str, source: str, expected: set[str]
) -> None:
    """The collector itself, on a fake module `name`: importing a submodule runs its package's
    __init__ (an import of the package too, unless the importer is inside it)."""
    path = tmp_path / "fake.py"
    path.write_text(source, encoding="utf-8")
    assert imported(name, path, module_files()) == expected


GRAPH_INTRO = "`python -m tests.test_imports` prints it):"


def drawn_graph() -> str:
    """Each module's seq2seq imports, by layer, lowest first, as DESIGN.md draws them."""
    layers, graph = documented_layers(), import_graph()
    lines = []
    for index, (layer, _) in enumerate(layers):
        lines.append(f"{index + 1} {layer}")
        for module in sorted(m for m in graph if m != "seq2seq" and layer_of(m, layers) == index):
            targets = ", ".join(sorted(t.removeprefix("seq2seq.") for t in graph[module]))
            line = f"{module.removeprefix('seq2seq.')} -> {targets or '(nothing)'}"
            lines.append(textwrap.fill(line, 96, initial_indent="  ", subsequent_indent="      "))
    return "\n".join(lines)


def test_design_draws_the_import_graph_as_it_is() -> None:
    """DESIGN.md's drawing of the graph is today's: a new import shows up as a failure here, so
    the drawing is updated with it (paste `python -m tests.test_imports`)."""
    text = DESIGN.read_text(encoding="utf-8")
    assert GRAPH_INTRO in text, f"{DESIGN} has no line ending {GRAPH_INTRO!r} before the graph"
    block = text.split(GRAPH_INTRO, 1)[1].split("```", 2)[1].removeprefix("text\n").rstrip("\n")
    assert block == drawn_graph(), (
        f"{DESIGN}'s import graph is out of date: paste `python -m tests.test_imports` into it"
    )


if __name__ == "__main__":
    print(drawn_graph())
