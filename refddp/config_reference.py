"""``python -m refddp.config_reference``: the configuration reference (docs/configuration.md),
generated from ``TrainConfig``'s fields, so it cannot drift from the options themselves.
"""

from __future__ import annotations

import dataclasses

from refddp.config.schema import FIELDS, INVOCATION
from refddp.config.validation import bounds_text

HEADER = """# Configuration reference

Generated from `refddp/config/schema.py` by
`python -m refddp.config_reference > docs/configuration.md` (a test checks it is current). Every
field is a YAML key of `--config FILE.yaml` and a flag (`--batch-size`; booleans also
`--no-...`). Precedence: CLI flag > YAML > the resumed checkpoint's config > default.

*On resume* is what a resumed run does with a new value: **applied** (in effect from the first
resumed step), **refused** (a usage error: it would be another run; start one with
`--init-from`), **derived** (the run's global batch is kept, the per-rank batch follows), or
*this invocation* (never taken from a checkpoint).

| field | default | on resume | valid | meaning |
|---|---|---|---|---|
"""


def _valid(f: dataclasses.Field) -> str:
    policy, parts = f.metadata, []
    if policy["choices"]:
        parts.append(" / ".join(f"`{c}`" for c in policy["choices"]))
    if policy["items"]:
        parts.append("a comma-separated list of " + ", ".join(f"`{i}`" for i in policy["items"]))
    if bounds_text(policy):
        parts.append(bounds_text(policy))
    if policy["imports"]:
        parts.append("may name `package.module:callable`")
    if policy["joined"]:
        parts.append("the same on every node")
    return "; ".join(parts)


def reference_markdown() -> str:
    rows = []
    for name, f in FIELDS.items():
        resume = f.metadata["resume"]
        resume = "this invocation" if resume is INVOCATION else resume
        default = f"`{f.default!r}`" if f.default != "" else "`''`"
        help_text = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{name}` | {default} | {resume} | {_valid(f)} | {help_text} |")
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
