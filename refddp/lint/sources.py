"""The files the lint reads: which ones, their module names and what their imports bind.

Paths are files or directories (searched recursively for ``*.py``, skipping hidden
directories, ``__pycache__`` and virtual environments). Nothing is imported or run: each file
is parsed with ``ast``. A path that does not exist or a file that does not parse is a usage
error (``LintUsageError``): one line naming the file, no traceback; the command names each
such file and still checks the others (``load_readable``).
"""

from __future__ import annotations

import ast
import tokenize
from dataclasses import dataclass, field
from pathlib import Path


class LintUsageError(Exception):
    """A path the lint cannot read: the message is the one line to show."""


@dataclass
class Module:
    """One parsed file: its dotted name (from the packages around it) and its imports."""

    name: str
    path: Path
    display: str  # the path as reports show it
    tree: ast.Module
    lines: list[str]
    # local name -> what it names, e.g. {"dist": "torch.distributed", "DDP":
    # "torch.nn.parallel.DistributedDataParallel"}; imports anywhere in the file count
    aliases: dict[str, str] = field(default_factory=dict)

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def _skipped(directory: Path) -> bool:
    return (directory.name.startswith(".") or directory.name == "__pycache__"
            or (directory / "pyvenv.cfg").exists())  # fmt: skip


def python_files(paths: list[str]) -> list[tuple[Path, str]]:
    """(file, how to show it) for every path: a file as given, a directory's ``*.py`` files."""
    found: list[tuple[Path, str]] = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            found.append((path, given))
        elif path.is_dir():
            for file in sorted(path.rglob("*.py")):
                parents = file.relative_to(path).parents
                if not any(_skipped(path / p) for p in parents if str(p) != "."):
                    found.append((file, str(path / file.relative_to(path))))
        else:
            raise LintUsageError(f"{given}: no such file or directory (give .py files or "
                                 "directories of them)")  # fmt: skip
    unique = {p.resolve(): (p, shown) for p, shown in found}
    return sorted(unique.values(), key=lambda item: item[1])


def module_name(path: Path) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod`` while the directories hold ``__init__.py``."""
    path = path.resolve()
    parts = [] if path.name == "__init__.py" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").exists():
        parts.insert(0, directory.name)
        directory = directory.parent
    return ".".join(parts) or path.parent.name


def import_aliases(tree: ast.Module, package: str) -> dict[str, str]:
    """What each imported name stands for, relative imports resolved against ``package``."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.partition(".")[0]
                    aliases.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}".lstrip(".")
    return aliases


def parse(path: Path, shown: str) -> Module:
    """One file, parsed; a file that is not Python 3 source is a usage error. Read as Python
    reads it (``tokenize.open``: a UTF-8 byte-order mark, a ``# -*- coding: ... -*-`` line)."""
    try:
        with tokenize.open(path) as source:
            text = source.read()
        tree = ast.parse(text, filename=shown)
    except SyntaxError as exc:
        raise LintUsageError(f"{shown}:{exc.lineno or 0}: cannot parse: {exc.msg} (the lint "
                             "reads Python 3 source)") from None  # fmt: skip
    except (RecursionError, MemoryError):
        raise LintUsageError(f"{shown}: cannot parse: nested too deeply for Python's parser "
                             "here") from None  # fmt: skip
    except (UnicodeDecodeError, OSError) as exc:
        raise LintUsageError(f"{shown}: cannot read: {exc}") from None
    module = Module(module_name(path), path, shown, tree, text.splitlines())
    module.aliases = import_aliases(tree, module.package)
    return module


def from_tree(tree: ast.Module, shown: str, lines: list[str]) -> Module:
    """A file already parsed (by flake8, or from text), known by its own name alone."""
    path = Path(shown)
    module = Module(path.stem or "source", path, shown, tree, lines)
    module.aliases = import_aliases(tree, "")
    return module


def load(paths: list[str]) -> list[Module]:
    """Every file under ``paths``, parsed; the first that cannot be is a usage error."""
    modules, unreadable = load_readable(paths)
    if unreadable:
        raise LintUsageError(unreadable[0])
    return modules


def load_readable(paths: list[str]) -> tuple[list[Module], list[str]]:
    """Every file under ``paths`` that parses, and one line for each that does not: one bad
    file (a Python 2 leftover, a broken fixture) does not hide the others' findings."""
    if not paths:
        raise LintUsageError("no path given (give .py files or directories of them)")
    modules, unreadable = [], []
    for path, shown in python_files(paths):
        try:
            modules.append(parse(path, shown))
        except LintUsageError as exc:
            unreadable.append(str(exc))
    return modules, unreadable
