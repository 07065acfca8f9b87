"""``python -m refddp.plot RUN_DIR``: loss, validation metrics and throughput from history.jsonl.

Writes ``RUN_DIR/curves.png``. Needs matplotlib (``pip install 'refddp[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


class PlotError(ValueError):
    """A user error: printed as one line, exit code 2."""


def read_history(run_dir: str) -> list[dict[str, Any]]:
    path = os.path.join(run_dir, "history.jsonl")
    if not os.path.isfile(path):
        raise PlotError(f"{path}: not found (is {run_dir} a refddp run directory?)")
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise PlotError(f"{path}:{number}: not a JSON line") from None
            if "skipped" not in record:  # a skipped step's line (refddp/training/trackers/jsonl.py)
                records.append(record)
    if not records:
        raise PlotError(f"{path}: no evaluations recorded yet")
    return records


def plot(run_dir: str, output: str | None = None) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("matplotlib is not installed: pip install 'refddp[plot]'") from None
    history = read_history(run_dir)
    steps = [h["step"] for h in history]
    # A panel for each validation metric the run records (accuracy, perplexity, the user's).
    metrics = [k for k in history[-1] if k.startswith("val_") and k != "val_loss"]
    fig, axes = plt.subplots(1, 2 + len(metrics), figsize=(4.4 * (2 + len(metrics)), 3.8))
    loss_ax, *metric_axes, speed_ax = axes
    loss_ax.plot(steps, [h["train_loss"] for h in history], "o-", label="train")
    loss_ax.plot(steps, [h["val_loss"] for h in history], "o-", label="validation")
    loss_ax.set(title="loss", xlabel="optimizer step")
    loss_ax.legend()
    for ax, name in zip(metric_axes, metrics, strict=True):
        ax.plot(steps, [h.get(name) for h in history], "o-", color="tab:green")
        title = {"val_acc": "accuracy"}.get(name, name.removeprefix("val_").replace("_", " "))
        ax.set(title=f"validation {title}", xlabel="optimizer step")
        if name == "val_acc":
            ax.set_ylim(0, 1)
    # Sequence runs count tokens (targets); others samples.
    per_token = "val_perplexity" in history[-1] and "targets_per_s" in history[-1]
    speed = "targets_per_s" if per_token else "samples_per_s"
    speed_ax.plot(steps, [h[speed] for h in history], "o-", color="tab:purple")
    unit = "tokens/s" if per_token else "samples/s"
    speed_ax.set(title=f"throughput ({unit})", xlabel="optimizer step", ylim=(0, None))
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    output = output or os.path.join(run_dir, "curves.png")
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refddp.plot", description=__doc__)
    parser.add_argument("run_dir", help="a run directory holding history.jsonl")
    parser.add_argument("--output", help="PNG path (default: RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        print(plot(args.run_dir, args.output))
    except PlotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
