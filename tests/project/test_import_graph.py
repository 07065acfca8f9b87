"""No refddp module imports another that imports it back, however late the import, and each
part of the layout imports only the parts docs/layout.md says it may.

Read from the source (no module is imported): every ``import`` statement counts, at module
level, inside a function or under ``if TYPE_CHECKING``. A ``from package import name`` names
the submodule ``package.name`` when there is one, else the package. A submodule's own parent
package is not an edge: Python initialises the package first, by design.
"""

import ast
from pathlib import Path

import refddp

PACKAGE = Path(refddp.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by its dotted name."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool,
             modules: dict[str, Path]) -> set[str]:
    """The package's modules one import statement in module ``importer`` names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    base = node.module or ""
    if node.level:  # relative: from the importer's package, up level - 1 more
        package = importer.split(".")[: None if is_package else -1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    names = {f"{base}.{alias.name}" for alias in node.names}
    return {name if name in modules else base for name in names} & modules.keys()


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        statements = [node for node in ast.walk(ast.parse(path.read_text(), str(path)))
                      if isinstance(node, ast.Import | ast.ImportFrom)]  # fmt: skip
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(imported(s, name, is_package, modules) for s in statements))
        graph[name].discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports, as the modules on it (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None


def test_refddps_modules_import_one_another_without_a_cycle():
    graph = import_graph(PACKAGE)
    assert {"refddp.checkpoints.loading", "refddp.checkpoints.run_state", "refddp.testing.driver.pool"} <= graph.keys()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("from pkg.c import helper\n")
    (package / "c.py").write_text("def helper():\n    from . import a\n    return a\n")
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("def helper():\n    return 1\n")
    assert find_cycle(import_graph(package)) is None


# The parts of the layout, lowest first, and what each may import besides itself
# (docs/layout.md, "What may import what"). A module belongs to the part with the longest
# prefix of its name; the package's own ``refddp/__init__.py`` is a command-level entry point.
PARTS = {
    "config": ("refddp.config",),
    "launch": ("refddp.launch",),
    "workload": ("refddp.workload",),
    "checkpoints": ("refddp.checkpoints",),
    "training": ("refddp.training",),
    "commands": ("refddp", "refddp.train", "refddp.doctor", "refddp.export", "refddp.plot",
                 "refddp.convert_checkpoint", "refddp.config_reference"),
    "lint": ("refddp.lint",),
    "harness, shared": ("refddp.testing.context", "refddp.testing.protocol",
                        "refddp.testing.payload", "refddp.testing.slots",
                        "refddp.testing.rank_lists", "refddp.testing.faults"),
    "harness, nodes": ("refddp.testing.nodes", "refddp.testing.cluster"),
    "harness, checks": ("refddp.testing.checks",),
    "harness, rank side": ("refddp.testing.rank",),
    "harness, driver side": ("refddp.testing.driver",),
    "harness, entry points": ("refddp.testing", "refddp.testing.plugin",
                              "refddp.testing.torch_suites"),
}
TRAINER_BASE = {"config", "launch"}
HARNESS_BASE = {"config", "launch", "harness, shared"}
MAY_IMPORT = {
    "config": set(),
    "launch": {"config"},
    "workload": {"config", "launch"},
    "checkpoints": {"config", "launch"},
    "training": {"config", "launch", "workload", "checkpoints"},
    "commands": {"config", "launch", "workload", "checkpoints", "training"},
    "lint": set(),
    "harness, shared": {"config", "launch"},
    "harness, nodes": HARNESS_BASE,
    "harness, checks": HARNESS_BASE,
    "harness, rank side": HARNESS_BASE | {"harness, nodes", "harness, checks"},
    "harness, driver side": HARNESS_BASE | {"harness, nodes", "harness, checks",
                                            "harness, rank side"},
    "harness, entry points": HARNESS_BASE | {"lint", "harness, nodes", "harness, checks",
                                             "harness, rank side", "harness, driver side"},
}
# The registries of --ckpt-format's and --log-to's choices: the config reads its choices from
# them, so they import nothing of refddp themselves, and any part may import them.
REGISTRIES = ("refddp.checkpoints.formats", "refddp.training.trackers")


def part_of(module: str) -> str:
    """The part of the layout ``module`` belongs to (the longest prefix that names it)."""
    best, length = "", -1
    for part, prefixes in PARTS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = part, len(prefix)
    assert best, f"{module}: in no part of the layout (add it to PARTS and docs/layout.md)"
    return best


def arrows_against_the_layout(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes where its part may not, as ``importer -> imported (part -> part)``."""
    wrong = []
    for importer, imported in sorted(graph.items()):
        source = part_of(importer)
        for target in sorted(imported):
            if target in REGISTRIES:
                continue
            dest = part_of(target)
            if dest != source and dest not in MAY_IMPORT[source]:
                wrong.append(f"{importer} -> {target} ({source} -> {dest})")
    return wrong


def test_every_part_imports_only_what_the_layout_allows():
    graph = import_graph(PACKAGE)
    assert not arrows_against_the_layout(graph), "\n".join(arrows_against_the_layout(graph))
    assert set(MAY_IMPORT) == set(PARTS)
    for registry in REGISTRIES:
        assert graph[registry] == set(), f"{registry} is a registry: it imports nothing of refddp"


def test_an_arrow_against_the_layout_is_found():
    graph = import_graph(PACKAGE)
    before = set(arrows_against_the_layout(graph))
    graph["refddp.launch.dist"] = graph["refddp.launch.dist"] | {"refddp.training.trainer"}
    graph["refddp.testing.rank.worker"] = graph["refddp.testing.rank.worker"] | {
        "refddp.training.parallel"}
    assert [a for a in arrows_against_the_layout(graph) if a not in before] == [
        "refddp.launch.dist -> refddp.training.trainer (launch -> training)",
        "refddp.testing.rank.worker -> refddp.training.parallel (harness, rank side -> training)",
    ]
