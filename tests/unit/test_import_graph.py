"""No refddp module imports another that imports it back, however late the import.

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
