"""popgrpo's modules import each other without cycles, and every import points down the layers;
the benchmarks' modules import each other without cycles too.

Every import statement counts, at module level or inside a function (a function-level import
that closes a cycle or climbs a layer is still one in the design), except those under
``if TYPE_CHECKING``. A lazy ``"module:attr"`` registry target (popgrpo.registry) is a string,
not an import: that is how the bottom layer names the built-ins above it.

:data:`LAYERS` is the layer table that docs/reference/design.md draws: a module may import its
own layer and the layers below it, never one above.
"""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "popgrpo"
DESIGN = PACKAGE.parent / "docs" / "reference" / "design.md"

# Bottom to top: (layer, the module prefixes in it). A module belongs to the layer of its
# longest matching prefix; every popgrpo module must belong to one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("popgrpo", "popgrpo.registry", "popgrpo.columns", "popgrpo.config")),
    ("core", ("popgrpo.core",)),
    ("telemetry", ("popgrpo.telemetry",)),
    ("envs, policies", ("popgrpo.envs", "popgrpo.policies")),
    ("algorithms", ("popgrpo.algorithms",)),
    ("runtime", ("popgrpo.runtime",)),
    ("one run, reward models", ("popgrpo.train", "popgrpo.preflight", "popgrpo.reward_models")),
    ("operations", ("popgrpo.ops",)),
    ("research tools", ("popgrpo.research",)),
    ("entry points", ("popgrpo.cli", "popgrpo.__main__")),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """popgrpo modules that ``path`` imports (``from a.b import c`` is ``a.b.c`` when that is a module)."""
    tree = ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` → the modules of ``package`` it imports."""
    files = {_module_name(p): p for p in package.rglob("*.py")}
    modules = set(files)
    return {name: _imports(path, modules) - {name} for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int:
    """Index in ``layers`` of ``module``'s layer (its longest matching prefix); -1 when none."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    return best


def _upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """``"a (layer) -> b (layer)"`` for every import of a higher layer's module."""
    out = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            low, high = _layer(module, layers), _layer(target, layers)
            if high > low:
                out.append(f"{module} ({layers[low][0]}) -> {target} ({layers[high][0]})")
    return out


def test_every_module_has_a_layer():
    assert [m for m in _graph() if _layer(m) < 0] == []


def test_imports_point_down_the_layers():
    assert _upward_imports(_graph()) == []


def test_the_layer_checker_finds_an_upward_import():
    graph = {
        "popgrpo.core.grpo": {"popgrpo.columns"},
        "popgrpo.algorithms.member": {"popgrpo.core.grpo", "popgrpo.algorithms.step", "popgrpo.reward_models.proxy"},
        "popgrpo.config.schema": {"popgrpo.registry"},
        "popgrpo.registry": set(),
    }
    assert _upward_imports(graph) == [
        "popgrpo.algorithms.member (algorithms) -> popgrpo.reward_models.proxy (one run, reward models)"
    ]
    assert _layer("popgrpo.configuration") == 0  # the root package, not popgrpo.config
    assert _layer("popgrpo.config.loader") == 0 and _layer("popgrpo.core") == 1


def test_no_import_cycle_in_popgrpo():
    assert _cycles(_graph()) == []


def test_no_import_cycle_in_benchmarks():
    graph = _graph(PACKAGE.parent / "benchmarks")
    assert "benchmarks.round_overhead" in graph["benchmarks.suite"]  # the graph sees function-level imports
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_imports_nothing_above_it():
    above = ("popgrpo.algorithms", "popgrpo.runtime", "popgrpo.envs", "popgrpo.policies", "popgrpo.telemetry")
    for module, imported in _graph().items():
        if module.startswith("popgrpo.core"):
            assert not [m for m in imported if m.startswith(above) or m == "popgrpo.config"], module


def _design_layers(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layer table of design.md's "Layers" section as ``LAYERS`` writes it, bottom to top.

    The table is the section's first fenced block, in columns two or more spaces apart: a
    line that starts a layer begins with its name; the paths are the field that starts where
    the first line's paths do, on that line or the ones under it. A path is relative to
    ``popgrpo/`` (``popgrpo/`` may be written or left out): ``x/`` is the package ``popgrpo.x``,
    ``x.py`` the module, ``popgrpo/`` alone the root package. Parenthesised text is a note.
    """
    section = ("\n" + text).split("\n## Layers\n", 1)[1]
    block = section.split("```", 2)[1]
    rows: list[tuple[str, list[str]]] = []
    column = None
    for line in block.splitlines():
        fields = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", line)]
        if not fields:
            continue
        if fields[0][0] == 0:
            rows.append((fields[0][1], []))
            column = fields[1][0] if column is None else column
        rows[-1][1].extend(field for start, field in fields if start == column)
    layers = []
    for name, cells in reversed(rows):
        paths = re.sub(r"\([^)]*\)", " ", " ".join(cells))
        prefixes = []
        for path in re.split(r"[,\s]+", paths.strip()):
            relative = path.removeprefix("popgrpo/").removesuffix("/").removesuffix(".py")
            prefixes.append(".".join(["popgrpo", *relative.split("/")]) if relative else "popgrpo")
        layers.append((name, tuple(sorted(prefixes))))
    return layers


def test_the_design_page_draws_the_layers_this_test_enforces():
    assert _design_layers(DESIGN.read_text()) == [(name, tuple(sorted(prefixes))) for name, prefixes in LAYERS]


def test_the_design_table_reader_reads_continuation_lines_notes_and_the_root():
    text = """## Layers

```
top        popgrpo/cli.py, jobs/     entry
                                     points
           popgrpo/research/sim/              a tool
bottom     popgrpo/config/, x.py,    config
           y.py
           popgrpo/ (any other       the root
           module)
```
"""
    assert _design_layers(text) == [
        ("bottom", ("popgrpo", "popgrpo.config", "popgrpo.x", "popgrpo.y")),
        ("top", ("popgrpo.cli", "popgrpo.jobs", "popgrpo.research.sim")),
    ]


def test_the_sandbox_package_modules_import_only_those_listed_before_them():
    """popgrpo.envs.sandbox's docstring lists its modules bottom to top; each imports only earlier ones."""
    package = "popgrpo.envs.sandbox"
    docstring = (PACKAGE / "envs" / "sandbox" / "__init__.py").read_text().split("one module per part", 1)[1]
    listed = re.findall(r"^``(\w+)``\s", docstring.split("\n\n", 2)[1], re.M)
    graph = _graph()
    modules = sorted(m.rsplit(".", 1)[1] for m in graph if m.startswith(package + "."))
    assert sorted(listed) == modules
    for i, name in enumerate(listed):
        imported = {m.rsplit(".", 1)[1] for m in graph[f"{package}.{name}"] if m.startswith(package + ".")}
        assert imported <= set(listed[:i]), (name, imported - set(listed[:i]))
