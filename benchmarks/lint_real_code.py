"""The lint on real training code: findings, speed, and bugs planted into copies.

    python benchmarks/lint_real_code.py --dir DIR [--repeats 5] [--no-record]

DIR holds one directory per project, each linted as one package (nothing is downloaded: put
the files there first, as benchmarks/lint_real_code.md says; never into this repository):

    DIR/nanogpt/train.py, DIR/nanogpt/model.py                    karpathy/nanoGPT
    DIR/torchtitan/torchtitan/train.py,
    DIR/torchtitan/torchtitan/components/checkpoint.py            pytorch/torchtitan
      (with empty __init__.py files, so the modules keep torchtitan's names)
    DIR/accelerate/*.py                                           huggingface/accelerate examples

For every file: its lines, the findings and notes the lint reports on the project, and the
lint's time on the file alone (the median of ``--repeats`` runs, in ms per 1,000 lines). Then
each planted bug (``PLANTS``: a line of the real file, replaced in a temporary copy) and
whether the lint reports it, with the expected code, at the expected line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from refddp.lint import lint_paths  # noqa: E402

# (project, file, a line that occurs once, what replaces it, code, text of the line reported)
PLANTS = [
    ("nanogpt", "train.py",
     "                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))\n",
     "                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))\n"
     "                torch.distributed.barrier()  # planted\n",
     "RDL101", "torch.distributed.barrier()  # planted"),
    ("nanogpt", "train.py",
     "        lossf = loss.item() * gradient_accumulation_steps\n",
     "        torch.distributed.all_reduce(loss)  # planted\n"
     "        lossf = loss.item() * gradient_accumulation_steps\n",
     "RDL101", "torch.distributed.all_reduce(loss)  # planted"),
    ("nanogpt", "train.py",
     "        X, Y = get_batch('train')\n",
     "        X, Y = get_batch('train')\n"
     "        if master_process and micro_step == 0:\n"
     "            continue  # planted: rank 0 skips a backward\n",
     "RDL102", "scaler.scale(loss).backward()"),
    ("nanogpt", "train.py",
     "X, Y = get_batch('train') # fetch the very first batch\n",
     "X, Y = get_batch('train') # fetch the very first batch\n"
     "for _ in range(ddp_rank if ddp else 0):\n"
     "    torch.distributed.barrier()  # planted\n",
     "RDL103", "torch.distributed.barrier()  # planted"),
    ("torchtitan", "torchtitan/train.py",
     '            logger.info("Training completed")\n',
     '            logger.info("Training completed")\n'
     "            self.checkpointer.save(self.step, last_step=True)  # planted\n",
     "RDL101", "self.checkpointer.save(self.step, last_step=True)  # planted"),
    ("torchtitan", "torchtitan/train.py",
     "                self.gc_handler.run(self.step)\n",
     "                self.gc_handler.run(self.step)\n"
     "                if torch.distributed.get_rank() == 0 and self.step > 100:\n"
     "                    break  # planted: rank 0 stops alone\n",
     "RDL102", "self.checkpointer.save("),
    ("torchtitan", "torchtitan/components/checkpoint.py",
     "            discovered_checkpoints.sort()\n",
     "            discovered_checkpoints.sort()\n"
     "            dist.barrier()  # planted\n",
     "RDL101", "dist.barrier()  # planted"),
    ("accelerate", "complete_nlp_example.py",
     "                    accelerator.save_state(output_dir)\n",
     "                    if accelerator.is_main_process:  # planted\n"
     "                        accelerator.save_state(output_dir)\n",
     "RDL101", "                        accelerator.save_state(output_dir)"),
    ("accelerate", "nlp_example.py",
     "            predictions, references = accelerator.gather_for_metrics("
     "(predictions, batch[\"labels\"]))\n",
     "            if not accelerator.is_local_main_process:  # planted\n"
     "                continue\n"
     "            predictions, references = accelerator.gather_for_metrics("
     "(predictions, batch[\"labels\"]))\n",
     "RDL102", "accelerator.gather_for_metrics("),
    ("accelerate", "deepspeed_with_config_support.py",
     "            tokenizer.save_pretrained(args.output_dir)\n",
     "            tokenizer.save_pretrained(args.output_dir)\n"
     "            accelerator.wait_for_everyone()  # planted\n",
     "RDL101", "accelerator.wait_for_everyone()  # planted"),
]  # fmt: skip


def timed(paths: list[str], repeats: int) -> tuple[list, float]:
    """The lint's findings on ``paths``, and its median wall time in seconds."""
    times, found = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        found = lint_paths(paths)
        times.append(time.perf_counter() - start)
    return found, statistics.median(times)


def measure(root: Path, repeats: int) -> list[dict]:
    rows = []
    for project in sorted(p for p in root.iterdir() if p.is_dir()):
        found = lint_paths([str(project)])
        for file in sorted(project.rglob("*.py")):
            lines = len(file.read_text().splitlines())
            if not lines:
                continue  # the empty __init__.py files
            mine = [f for f in found if Path(f.path).resolve() == file.resolve()]
            _, seconds = timed([str(file)], repeats)
            rows.append({"project": project.name, "file": str(file.relative_to(project)),
                         "lines": lines, "findings": [str(f) for f in mine if not f.is_note],
                         "notes": [str(f) for f in mine if f.is_note],
                         "ms": 1000 * seconds, "ms_per_kloc": 1e6 * seconds / lines})
        _, seconds = timed([str(project)], repeats)
        lines = sum(len(f.read_text().splitlines()) for f in project.rglob("*.py"))
        rows.append({"project": project.name, "file": "(all, together)", "lines": lines,
                     "findings": [str(f) for f in found if not f.is_note],
                     "notes": [str(f) for f in found if f.is_note],
                     "ms": 1000 * seconds, "ms_per_kloc": 1e6 * seconds / lines})
    return rows


def plant(root: Path) -> list[dict]:
    results = []
    for project, file, anchor, replacement, code, reported in PLANTS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / project
            shutil.copytree(root / project, copy)
            target = copy / file
            text = target.read_text()
            if text.count(anchor) != 1:
                results.append({"project": project, "file": file, "code": code,
                                "found": None, "why": "the anchor line is not there once"})
                continue
            start = text[: text.index(anchor)].count("\n") + 1
            text = text.replace(anchor, replacement)
            target.write_text(text)
            line = next(i for i, t in enumerate(text.splitlines(), 1) if i >= start
                        and reported in t)  # fmt: skip
            found = lint_paths([str(copy)])
            hit = [f for f in found if Path(f.path).resolve() == target.resolve()
                   and f.line == line and f.code == code]  # fmt: skip
            results.append({"project": project, "file": file, "code": code, "line": line,
                            "found": bool(hit), "finding": str(hit[0]).replace(tmp, "")
                            if hit else None})  # fmt: skip
    return results


def table(rows: list[dict], plants: list[dict]) -> str:
    out = ["| project | file | lines | findings | notes | ms (alone) | ms per 1,000 lines |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['project']} | {r['file']} | {r['lines']} | {len(r['findings'])} | "
                   f"{len(r['notes'])} | {r['ms']:.0f} | {r['ms_per_kloc']:.0f} |")
    out += ["", "| planted in | code | at line | found |", "|---|---|---|---|"]
    for p in plants:
        out.append(f"| {p['project']}/{p['file']} | {p['code']} | {p.get('line', '-')} | "
                   f"{'yes' if p['found'] else 'NO' if p['found'] is False else p['why']} |")
    out.append("")
    for r in rows:
        if r["file"] == "(all, together)":
            out += [f"    {line}" for line in r["findings"] + r["notes"]]
    out += [f"    planted: {p['finding']}" for p in plants if p.get("finding")]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="one directory per project (see above)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true",
                        help="print only (no benchmarks/results/lint_real_code.json)")
    args = parser.parse_args()
    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: --dir {root}: no such directory (one directory per project)",
              file=sys.stderr)  # fmt: skip
        return 2
    load_before = os.getloadavg()[0]
    rows, plants = measure(root, args.repeats), plant(root)
    text = table(rows, plants)
    if args.no_record:
        print(text)
    else:
        from record import write  # it imports torch, for the machine's description

        write("lint_real_code", {"files": rows, "planted": plants}, text, load_before)
    return 0 if all(p["found"] for p in plants) else 1


if __name__ == "__main__":
    sys.exit(main())
