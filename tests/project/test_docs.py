"""The docs stay true to the tree: every test, file, link and mutant they cite exists, every
mutant and every module is named, and the configuration reference is the one ``TrainConfig``
generates."""

import ast
import re
from pathlib import Path

from refddp.config_reference import reference_markdown

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks/README.md"]
# The folders of tests/ (by concern: training/, harness/, ...), as the docs' test columns cite them.
TEST_FOLDERS = sorted(p.name for p in (REPO / "tests").iterdir() if any(p.glob("test_*.py")))
# A path from the repository's root (`refddp/training/trainer.py`, `tests/gpu`,
# `examples/slurm/`), or from tests/ as the docs' test columns write them
# (`training/test_x.py`), or a bare `test_x.py`;
# then maybe `::name` (a test, function or class; `name*` is any name it begins). A path
# inside a longer one (`/tmp/userproj/tests/test_cause.py` in a pasted report) is not cited.
CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:refddp|tests|benchmarks|examples|docs|" + "|".join(TEST_FOLDERS) + ")/"
    r"[\w/.-]*[\w/]|test_\w+\.py)(?:::(\w+\*?))?"
)
CITED_NAME = re.compile(r"(?<![\w.])::(\w+\*?)")  # `::test_y`: in the file cited last before it
# `test_y` alone in prose: defined in some test file (examples in code blocks are not citations)
CITED_TEST = re.compile(r"(?<![\w/.:*-])(test_\w+\*?)(?![\w.(-])")
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target): a relative file, maybe with #anchor
LAYOUT = REPO / "docs" / "layout.md"
# __init__ files that only re-export names lazily, named in the layout's prose (the registries
# in objectives/ and trackers/ are not trivial: the layout names them); a folder's __init__
# that holds only its docstring is described by its folder's heading
TRIVIAL_INITS = {"refddp/__init__.py", "refddp/testing/__init__.py"}


def only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return len(body) <= 1 and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                  for n in body)  # fmt: skip


def resolve(path: str) -> Path | None:
    """A cited path (from the root, or from tests/), or a bare ``test_x.py`` under tests/."""
    if "/" in path:
        for base in (REPO, REPO / "tests"):
            if (base / path).exists():
                return base / path
        return None
    found = list((REPO / "tests").rglob(path))
    return found[0] if len(found) == 1 else None


def defines(file: Path, name: str) -> bool:
    """``file`` defines ``name`` (a function or class), or a name it begins with ``name*``."""
    pattern = re.escape(name[:-1]) + r"\w*" if name.endswith("*") else re.escape(name) + r"\b"
    return re.search(rf"^\s*(?:def|class) {pattern}", file.read_text(), re.M) is not None


def defined_tests() -> set[str]:
    names = set()
    for file in (REPO / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^(?:    )?def (test_\w+)", file.read_text(), re.M))
    return names


def cited_names(text: str) -> list[tuple[str, str | None]]:
    """(file, name) for every cited path and every name cited after one, in reading order."""
    spans = sorted(
        [(m.start(), m[1], m[2]) for m in CITED_PATH.finditer(text)]
        + [(m.start(), None, m[1]) for m in CITED_NAME.finditer(text)]
    )
    cited, last_file = [], None
    for _, path, name in spans:
        if path is not None:
            last_file = path
        cited.append((path or last_file, name))
    return cited


def problems_in(text: str, every_test: set[str]) -> list[str]:
    problems = []
    for path, name in cited_names(text):
        file = resolve(path) if path else None
        if file is None:
            problems.append(f"{path}" + (f"::{name}" if name else "") + " (no such file)")
        elif name and (file.is_dir() or not defines(file, name)):
            problems.append(f"{path}::{name}")
    prose = FENCED.sub("", text)
    for name in sorted({m[1] for m in CITED_TEST.finditer(prose)}):
        prefix = name.rstrip("*")
        if not any(t == name or (name.endswith("*") and t.startswith(prefix)) for t in every_test):
            problems.append(name)
    return problems


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCED.sub("", doc.read_text())
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(doc: Path) -> list[str]:
    """Relative links of ``doc`` to a file that does not exist, or to a heading it lacks."""
    broken = []
    for target in LINK.findall(FENCED.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not this repository's
        path, _, fragment = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(target)
    return broken


def test_every_file_and_test_the_docs_cite_exists():
    every_test = defined_tests()
    missing = [f"{doc.relative_to(REPO)}: {problem}" for doc in DOCS
               for problem in problems_in(doc.read_text(), every_test)]
    assert not missing, "cited but not found:\n" + "\n".join(missing)


def test_every_link_between_the_docs_reaches_its_file_and_heading():
    broken = [f"{doc.relative_to(REPO)}: {link}" for doc in DOCS for link in broken_links(doc)]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_citation_check_catches_what_it_is_for():
    every_test = defined_tests()
    text = "\n".join([
        "`project/test_docs.py::test_no_such_test`",  # a test its file does not define
        "`tests/project/test_docs.py`, `::test_the_readme_stays_short`, `::test_gone`",
        "`refddp/no_such_module.py`",
        "(`test_never_written_anywhere`)",
        "`harness/test_harness.py::test_one_sided_*`",  # a prefix that exists
    ])
    assert problems_in(text, every_test) == [
        "project/test_docs.py::test_no_such_test", "tests/project/test_docs.py::test_gone",
        "refddp/no_such_module.py (no such file)", "test_never_written_anywhere",
    ]


def test_the_link_check_catches_what_it_is_for(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# A heading\n\n[ok](#a-heading) [gone](#no-heading) [file](nowhere.md) "
                   "[web](https://example.com/x.md)\n")
    assert broken_links(doc) == ["#no-heading", "nowhere.md"]


def test_the_docs_cite_only_mutants_that_exist_and_every_one_of_them():
    from tests.mutation.mutants import MUTANTS

    names = {m.name for m in MUTANTS}
    text = (REPO / "docs" / "guarantees.md").read_text()
    cited_mutants = set(re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+){2,})`", text))
    assert cited_mutants, "guarantees.md names its mutants"
    assert cited_mutants <= names, sorted(cited_mutants - names)
    # a mutant no row names is a guarantee the docs do not state
    assert names <= cited_mutants, "not in guarantees.md: " + ", ".join(sorted(names - cited_mutants))


def test_the_layout_map_names_every_module():
    text = LAYOUT.read_text()
    modules = {str(p.relative_to(REPO)) for p in (REPO / "refddp").rglob("*.py")
               if not (p.name == "__init__.py" and only_a_docstring(p))}  # fmt: skip
    unnamed = [m for m in sorted(modules - TRIVIAL_INITS) if f"`{m}`" not in text]
    assert not unnamed, "modules docs/layout.md does not name: " + ", ".join(unnamed)


def test_the_configuration_reference_is_generated_from_trainconfig():
    written = (REPO / "docs" / "configuration.md").read_text()
    assert written == reference_markdown(), (
        "docs/configuration.md is stale: python -m refddp.config_reference > docs/configuration.md"
    )


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    assert max(map(len, lines)) <= 300
