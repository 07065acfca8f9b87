"""Every private name refddp uses has an entry in ``docs/known-limitations.md``.

A private name is one with a single leading underscore that refddp reads but does not define:
an attribute (``torch.cuda.memory._dump_snapshot``), an imported name or module, a name
handed to ``getattr``/``hasattr`` as a string, or a method refddp overrides in a class it
does not own (``DynamicRendezvousHandler._create_tcp_store_server``). A torch release that
renames one breaks refddp silently unless it is detected where it is used; the entry says how.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Private torch names refddp uses"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def _names_read(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.update(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(node.module.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return {name for name in found if _private(name) and name.isidentifier()}


def _names_defined(tree: ast.AST) -> set[str]:
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.alias) and node.asname:
            defined.add(node.asname)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):  # fmt: skip
            defined.add(node.attr)
    return defined


def _overrides(path: Path, tree: ast.AST) -> set[str]:
    """Private methods that replace one of a base class refddp does not define."""
    module = importlib.import_module(_module_name(path))
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, node.name, None)
        if not inspect.isclass(cls):
            continue
        for item in node.body:
            if not (isinstance(item, ast.FunctionDef) and _private(item.name)):
                continue
            owners = [base for base in cls.__mro__[1:] if item.name in vars(base)]
            if any(not base.__module__.startswith("refddp") for base in owners):
                found.add(item.name)
    return found


def private_names() -> dict[str, set[str]]:
    """Each private name refddp uses, with the files that use it."""
    trees = {p: ast.parse(p.read_text()) for p in sorted((REPO / "refddp").rglob("*.py"))}
    defined = set().union(*(_names_defined(tree) for tree in trees.values()))
    used: dict[str, set[str]] = {}
    for path, tree in trees.items():
        names = (_names_read(tree) - defined) | _overrides(path, tree)
        for name in names:
            used.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return used


def _listed() -> str:
    text = (REPO / "docs" / "known-limitations.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def test_every_private_name_refddp_uses_is_listed_with_its_reason():
    listed = _listed()
    unlisted = {
        name: sorted(files)
        for name, files in private_names().items()
        if not re.search(rf"`[^`\n]*\b{re.escape(name)}\b[^`\n]*`", listed)
    }
    assert not unlisted, (
        f"private names with no entry under {SECTION!r} in docs/known-limitations.md "
        f"(say why no public API does, and what a torch without it does): {unlisted}"
    )


def test_the_scan_finds_reads_string_lookups_and_overrides():
    # What the scan must see, so that the test above cannot pass by seeing nothing.
    used = private_names()
    assert "refddp/training/profiler.py" in used["_dump_snapshot"]  # an attribute
    assert "refddp/launch/dist.py" in used["_pg_registry"]  # a getattr string
    assert "refddp/launch/torchrun.py" in used["_create_tcp_store_server"]  # an override
    assert "refddp/training/sync_batchnorm.py" in used["_check_input_dim"]  # an override of a torch hook
    assert "_run_on_ranks" not in used  # refddp's own
