"""What the parts of refddp's step that a plain loop has no counterpart for cost, at one rank.

    python benchmarks/step_parts.py [--blocks 150] [--steps 16] [--model demo] [--name NAME]

step_overhead.py measures refddp's whole step against a plain loop's. This script takes the
skip of a non-finite step apart, to say how much of that overhead it is at a small step:

- ``norm``: the gradient's norm, read on the host each step to decide whether the update is
  applied (``Parallel.grad_norm``, ``refddp/training/parallel.py``);
- ``spread``: a non-finite loss made into a NaN loss scale (``spread_nonfinite``,
  ``refddp/training/skips.py``), so that the gradient's reduction carries it to every rank.

Each loop is its own ``Trainer`` over the same job (overhead_job.py): the whole step, and the
step with one part or both replaced by what costs nothing (the norm by a constant, the scale left as it is): a measurement only, as
such a step would apply an update whose gradient is NaN. They run in one process, one thread
(as step_overhead.py's ranks), in alternating blocks of ``--steps`` steps beside a plain loop
(the bare model, AdamW, the same loader), each round in another order of the loops; each block's time is compared
with the plain loop's block of the same round (``paired``), which the machine's drift moves
alike. An epoch's loader start is timed in both loops.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from torch.utils.data import DistributedSampler

from refddp.config.command_line import merge, parse_cli
from refddp.launch.dist import DistContext, init_distributed
from refddp.training import parallel, steps
from refddp.training.trainer import Trainer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from overhead_job import WEIGHT_DECAY, Job  # noqa: E402, I001
from record import allocator_env, write  # noqa: E402

CONSTANT_NORM = torch.tensor(1.0)
# A part left out: (object, attribute, what replaces it).
NO_NORM = (parallel.Parallel, "grad_norm", lambda self, max_norm=0.0: CONSTANT_NORM)
NO_SPREAD = (steps, "spread_nonfinite", lambda scale, loss: scale)
LEFT_OUT = {"refddp": [], "no norm": [NO_NORM], "no spread": [NO_SPREAD],
            "neither": [NO_NORM, NO_SPREAD]}  # fmt: skip


def refddp_loop(job: Job, ctx: DistContext, out: str, left_out: list) -> Callable[[int], float]:
    """Seconds per step of ``steps`` refddp steps with the parts in ``left_out`` replaced."""
    cli, _ = parse_cli([*job.refddp_flags(), "--epochs=1000", "--no-progress", "--resume=never",
                        f"--out={out}", "--device=cpu"])  # fmt: skip
    trainer = Trainer(merge(cli, {}), ctx)
    trainer.model.train()
    batches = [None]

    def block(count: int) -> float:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in left_out]
        for owner, name, replacement in left_out:
            setattr(owner, name, replacement)
        try:
            begin = time.perf_counter()
            for _ in range(count):
                if trainer.pos.step % trainer.sampler.steps_per_epoch == 0 or batches[0] is None:
                    batches[0] = trainer.epoch_batches()
                trainer.train_step(batches[0])
            return (time.perf_counter() - begin) / count
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    return block


def plain_loop(job: Job) -> Callable[[int], float]:
    """Seconds per step of ``count`` steps of the plain loop (step_overhead.py's, one rank)."""
    model, train, _ = job.build()
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=WEIGHT_DECAY)
    sampler = DistributedSampler(train, 1, 0, seed=0, drop_last=True)
    loader = job.loader(train, job.global_batch, "cpu", sampler=sampler, drop_last=True)
    state = {"epoch": 0, "batches": iter(())}
    cpu = torch.device("cpu")

    def block(count: int) -> float:
        begin = time.perf_counter()
        done = 0
        while done < count:
            batch = next(state["batches"], None)
            if batch is None:  # the epoch's end: the next one's loader, timed as refddp's is
                sampler.set_epoch(state["epoch"])
                state["epoch"] += 1
                state["batches"] = iter(loader)
                continue
            batch = job.to(batch, cpu)
            opt.zero_grad(set_to_none=True)
            job.loss(model, batch).backward()
            opt.step()
            done += 1
        return (time.perf_counter() - begin) / count

    return block


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=150)
    parser.add_argument("--steps", type=int, default=16, help="steps per block")
    parser.add_argument("--model", default="demo")
    parser.add_argument("--name", default="step_parts", help="results/NAME.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)
    job, ctx = Job(args.model), init_distributed("cpu")
    with tempfile.TemporaryDirectory() as out:
        loops = {"plain": plain_loop(job)}
        for name, left_out in LEFT_OUT.items():
            loops[name] = refddp_loop(job, ctx, os.path.join(out, name.replace(" ", "_")), left_out)
        names = list(loops)
        times: dict[str, list[float]] = {name: [] for name in names}
        orders = list(itertools.permutations(names))  # in turn: no loop always follows the same one
        for block in range(args.blocks + 2):  # the first two of each warm up
            for name in orders[block % len(orders)]:
                seconds = loops[name](args.steps)
                if block >= 2:
                    times[name].append(seconds)
    plain = statistics.median(times["plain"])
    results, rows = [], []
    for name in names:
        median = statistics.median(times[name])
        paired = statistics.median(p / t for p, t in zip(times["plain"], times[name], strict=True))
        results.append({"loop": name, "median_step_s": median, "throughput_vs_plain": plain / median,
                        "paired_throughput_vs_plain": paired,
                        "overhead_us_per_step": (median - plain) * 1e6, "blocks": times[name]})  # fmt: skip
        rows.append(f"{name:10} {median * 1e3:7.3f} ms | vs plain {plain / median:.3f}x (paired "
                    f"{paired:.3f}x) | overhead {(median - plain) * 1e6:+5.0f} us/step")  # fmt: skip
    header = (f"{args.model}, one rank, one thread: median time per step, {args.blocks} "
              f"blocks of {args.steps} steps per loop, in one process")  # fmt: skip
    write(args.name, {"model": args.model, "loops": results,
                      "allocator_env": allocator_env(dict(os.environ))},
          "\n".join([header, *rows]), load_before)  # fmt: skip


if __name__ == "__main__":
    main()
