"""``python -m refddp.lint PATH...``: the static check, as a command.

Prints one line per finding and note (``file:line:col: CODE message``), then a summary line on
stderr. Exit status: 0 when nothing was found (notes alone do not count, unless ``--strict``),
1 when there are findings, 2 on a usage error (a path that does not exist: one line naming
it; a file that does not parse: one line naming each, the others still checked).
"""

from __future__ import annotations

import argparse
import sys

from refddp.lint import CODES, LintUsageError, lint_readable_paths


def parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in CODES.items())
    p = argparse.ArgumentParser(
        prog="python -m refddp.lint",
        description="Find collectives that only some ranks reach, before anything runs. "
        "Reads the files (nothing is imported or run) and follows rank-dependent values "
        "through the package's own functions.",
        epilog=f"codes:\n{codes}\n\nA `# refddp: ignore` comment (or `# refddp: "
        "ignore[RDL101]`) on the reported line silences it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help=".py files or directories (searched recursively), analysed together")
    p.add_argument("--strict", action="store_true",
                   help="notes (RDL2xx: what the lint cannot see into) count as findings")
    p.add_argument("--no-notes", action="store_true", help="do not print notes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        findings, unreadable = lint_readable_paths(args.paths)
    except LintUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RecursionError:  # a chain of calls deeper than Python's stack lets the lint follow
        print("error: the code's calls nest too deeply for the lint to follow (Python's "
              "recursion limit); lint fewer files together", file=sys.stderr)  # fmt: skip
        return 2
    for line in unreadable:
        print(f"error: {line}", file=sys.stderr)
    shown = [f for f in findings if not (f.is_note and args.no_notes)]
    for finding in shown:
        print(finding)
    counted = [f for f in findings if args.strict or not f.is_note]
    notes = sum(f.is_note for f in findings)
    skipped = f", {len(unreadable)} file(s) not read" if unreadable else ""
    print(f"refddp.lint: {len(findings) - notes} finding(s), {notes} note(s){skipped}",
          file=sys.stderr)  # fmt: skip
    return 2 if unreadable else 1 if counted else 0


if __name__ == "__main__":
    sys.exit(main())
