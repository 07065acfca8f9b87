"""``pytest --dist-lint PATH``: the lint as test items, one per linted file.

Each file under the given paths (all of them analysed together, so the call graph crosses
files) becomes an item ``PATH::dist-lint`` that fails with the file's findings, one line
each; notes (``RDL2xx``) do not fail it, they are shown as warnings. Wired into pytest by
``refddp/testing/plugin.py`` (``add_lint_option``, ``register_lint_items``); a path that does
not exist or a file that does not parse is a usage error before any test runs.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from refddp.lint import Finding, LintUsageError, lint_modules
from refddp.lint.sources import load


def add_lint_option(group) -> None:
    group.addoption(
        "--dist-lint",
        action="append",
        default=[],
        metavar="PATH",
        help="lint PATH (a .py file or a directory, repeatable) for collectives that only "
        "some ranks reach: one test item per file (python -m refddp.lint)",
    )


class LintFailure(Exception):
    """A linted file's findings."""


class LintItem(pytest.Item):
    """One linted file: fails with its findings, warns with its notes."""

    def __init__(self, *, findings: list[Finding], **kwargs):
        super().__init__(**kwargs)
        self.findings = findings
        self.add_marker(pytest.mark.dist_lint)

    def runtest(self) -> None:
        for note in (f for f in self.findings if f.is_note):
            warnings.warn(pytest.PytestWarning(str(note)), stacklevel=1)
        found = [str(f) for f in self.findings if not f.is_note]
        if found:
            raise LintFailure("\n".join(found))

    def repr_failure(self, excinfo, style=None) -> str:
        if isinstance(excinfo.value, LintFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"dist-lint {self.path.name}"


class LintPlugin:
    """Adds the items at collection, before ``-k`` / ``-m`` select among them."""

    def __init__(self, paths: list[str]):
        try:
            self.modules = load(paths)
        except LintUsageError as exc:
            raise pytest.UsageError(f"--dist-lint: {exc}") from None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list) -> None:
        findings = lint_modules(self.modules)
        for module in self.modules:
            mine = [f for f in findings if f.path == module.display]
            nodeid = f"{module.display}::dist-lint"
            items.append(LintItem.from_parent(session, name=nodeid, nodeid=nodeid,
                                              path=Path(module.path).resolve(),
                                              findings=mine))  # fmt: skip


def register_lint_items(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "dist_lint: a file checked by --dist-lint")
    paths = config.getoption("dist_lint", default=[])
    if paths:
        config.pluginmanager.register(LintPlugin(paths), "refddp-dist-lint")
