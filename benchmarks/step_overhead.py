"""What refddp's training step costs over a plain DDP step, measured inside one process.

    python benchmarks/step_overhead.py [--blocks 40] [--steps 16] [--models demo,large] [--ranks 1,2]
                                       [--device cuda] [--variant FLAGS] [--amp bf16] [--compile]
                                       [--unread] [--profile DIR]

trainer_overhead.py compares whole runs, whose throughput on this shared 2-core machine moves
by 20-30% from one run to the next: more than the overhead it looks for. Here each rank holds
both loops at once, over the same job (overhead_job.py: model, data path, global batch, AdamW):
refddp's ``Trainer.train_step`` (loader fetch, the target count, the step's agreement
all-reduce, the loss scale, the gradient norm and its host read, the loss kept on the device,
optimizer, scheduler, watchdog) and a plain DDP step (one process: the bare
model), in alternating blocks of ``--steps`` steps. Each loop walks its epochs and both
train on the same batches at the same step: refddp's sampler and the plain loop's
DistributedSampler draw the same permutation (``randperm`` of seed 0 + epoch) and interleave
it over ranks alike. Both loops see the same machine at nearly the same moment, so the
median time per step of each, and their ratio, is steady to a few percent. Loader start-up
(once per epoch, in the block that starts it) is timed in neither; evaluation and checkpoints
are not steps. Each loop's minor page faults a step are reported beside its time (counted over
its whole block, an epoch's loader start included): pages the C allocator took fresh from the
kernel, a cost the same operations pay differently in each loop; the allocator's environment
(``MALLOC_*``, ``LD_PRELOAD``) is kept with the results.

``--device cuda``: NCCL ranks of one GPU each; the plain loop runs torch's fused AdamW and
copies pinned batches with ``non_blocking``, as plain_ddp_loop.py does, and each block is
timed from a synchronised device to a synchronised device, so work a loop leaves queued is
counted in its own block. ``--variant FLAGS``: a third loop, refddp's with FLAGS added
(``--grad-clip 1``, say), its own Trainer in the same process, in the same rotation.

``--amp bf16`` / ``--compile`` apply to both loops: refddp's flags of those names, and in the
plain loop ``torch.autocast`` around the forward and the loss and ``torch.compile`` of the
(DDP-wrapped) model, as refddp does them. GPT-2 small on one GPU (issue 47's bar):
``--device cuda --ranks 1 --models gpt2_124m --amp bf16 [--compile] --blocks 10 --steps 8``.

``--unread`` (one rank): a third loop, refddp's step with its one host read replaced by
constants, which applies every update whatever its gradient: a bound on what the read costs,
not a step refddp could take. ``--profile DIR``: after the timed blocks, one more block of each
loop under ``torch.profiler``, its trace and its operators' host times to DIR/MODEL_RANKS/.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from refddp.config.command_line import merge, parse_cli
from refddp.launch.dist import init_distributed
from refddp.training.step_agreement import Agreed
from refddp.training.trainer import Trainer
from refddp.training.watchdog import HangWatchdog

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from overhead_job import WEIGHT_DECAY, Job  # noqa: E402, I001
from record import allocator_env, write  # noqa: E402


def rank_main(model_name: str, args: argparse.Namespace, out: str) -> None:
    job = Job(model_name)
    device, variant = args.device, args.variant
    both = [f"--amp={args.amp}", *(["--compile"] if args.compile else [])]

    def config(extra: list[str]):  # type: ignore[no-untyped-def]
        # The job's own flags (as trainer_overhead.py runs it), epochs enough for every block.
        cli, _ = parse_cli([*job.refddp_flags(), "--epochs=1000", "--no-progress", "--resume=never",
                            f"--out={out}", f"--device={device}", *both, *extra])  # fmt: skip
        return merge(cli, {})

    c = config([])
    ctx = init_distributed(device)
    world, rank = ctx.world_size, ctx.rank
    stacks = os.path.join(out, "stacks", f"rank{rank}.txt")
    with HangWatchdog(stacks, c.timeout) as watchdog:
        trainers = {"refddp": Trainer(c, ctx, watchdog)}
        if variant:
            trainers["variant"] = Trainer(config(shlex.split(variant)), ctx, watchdog)
        if args.unread:
            trainers["unread"] = unread(Trainer(c, ctx, watchdog))
        times, faults = measure(trainers, job, torch.device(ctx.device), world, rank, args)
    if rank == 0:
        print(json.dumps({"times": times, "faults": faults}), flush=True)
    dist.destroy_process_group()


def unread(trainer: Trainer) -> Trainer:
    """``trainer`` with its step's one host read replaced by constants (a finite norm, no
    loss, no signal): a bound on what that read costs, not a valid step (the update is
    applied whatever the gradient). One process only."""
    agreement = trainer.agreement
    # ``_sent`` (this step's target count, as ``send`` kept it): a benchmark's reach into the
    # agreement, to leave everything but the read as the step does it.
    agreement.read = lambda grad_norm=None: Agreed(float(agreement._sent[0]), 0.0, 0, 1.0)
    return trainer


def measure(trainers: dict[str, Trainer], job: Job, device: torch.device, world: int,
            rank: int, args: argparse.Namespace) -> tuple[dict, dict]:  # fmt: skip
    """Seconds per step of each loop, per block (after two warm-up blocks of each), and the
    process's minor page faults per step in each block: a fault is a page the allocator took
    fresh from the kernel, which the kernel zeroes, so a loop whose allocations the C
    allocator keeps returning and taking back pays for it in time, on the same operations."""
    blocks, steps = args.blocks, args.steps
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else lambda: None
    for trainer in trainers.values():
        # Every block starts at a multiple of ``steps`` into an epoch and must not cross its end.
        assert trainer.sampler.steps_per_epoch % steps == 0, "--steps must divide steps per epoch"
        trainer.model.train()
    model, train, _ = job.build()
    model = model.to(device)
    plain = DDP(model, device_ids=[device] if cuda else None) if world > 1 else model
    if args.compile:
        plain = torch.compile(plain)

    def autocast():  # type: ignore[no-untyped-def]
        bf16 = args.amp == "bf16"
        return torch.autocast(device.type, torch.bfloat16) if bf16 else contextlib.nullcontext()

    opt = torch.optim.AdamW(plain.parameters(), lr=job.lr, weight_decay=WEIGHT_DECAY,
                            fused=cuda or None)  # fmt: skip
    sampler = DistributedSampler(train, world, rank, seed=0, drop_last=True)
    loader = job.loader(train, job.global_batch // world, device.type, sampler=sampler,
                        drop_last=True)  # fmt: skip
    steps_per_epoch = len(loader)  # refddp's too (both drop the last partial global batch)

    epochs: dict[str, object] = {}  # each loop's epoch's batches, kept across its blocks

    def refddp_block(name: str, trainer: Trainer) -> float:
        # A new epoch's iterator only where an epoch starts: within one, the step fetches the
        # next step's batches ahead (refddp/training/steps.py), as it does in a run.
        if trainer.pos.step % trainer.sampler.steps_per_epoch == 0 or name not in epochs:
            epochs[name] = trainer.epoch_batches()
        batches = epochs[name]
        sync()
        begin = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(batches)
        sync()
        return (time.perf_counter() - begin) / steps

    plain_steps = [0]  # the plain loop's steps so far

    def plain_block() -> float:
        # The plain loop walks its epochs as refddp's does, on the same batches at each step
        # (the same permutation): on the CPU other values run at another speed.
        epoch, into = divmod(plain_steps[0], steps_per_epoch)
        if into == 0:
            sampler.set_epoch(epoch)
            epochs["plain"] = iter(loader)
        plain_steps[0] += steps
        batches = epochs["plain"]
        sync()
        begin = time.perf_counter()
        for _ in range(steps):
            batch = job.to(next(batches), device)
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = job.loss(plain, batch)
            loss.backward()
            opt.step()
        sync()
        return (time.perf_counter() - begin) / steps

    loops = [(name, functools.partial(refddp_block, name, t)) for name, t in trainers.items()]
    loops.append(("plain", plain_block))
    times: dict[str, list[float]] = {name: [] for name, _ in loops}
    faults: dict[str, list[float]] = {name: [] for name, _ in loops}
    orders = list(itertools.permutations(loops))  # in turn: no loop always follows the same one
    for block in range(blocks + 2):  # the first two of each warm up
        for name, run in orders[block % len(orders)]:
            if world > 1:
                dist.barrier()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = run()
            if block >= 2:
                times[name].append(t)
                faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                                     - before) / steps)  # fmt: skip
    if args.profile and rank == 0:
        profile(loops, args.profile)
    return times, faults


def profile(loops: list, folder: str) -> None:
    """One more block of each loop under ``torch.profiler``: its trace (chrome format, gzipped)
    and its operators' host time, to ``folder``. Not timed: the profiler slows the host."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity

    os.makedirs(folder, exist_ok=True)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    for name, run in loops:
        with torch.profiler.profile(activities=activities) as prof:
            run()
        trace = os.path.join(folder, f"{name}.json")
        prof.export_chrome_trace(trace)
        with open(trace, "rb") as raw, gzip.open(trace + ".gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        os.remove(trace)
        with open(os.path.join(folder, f"{name}.txt"), "w") as table:
            table.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=16, help="steps per block (must divide the steps per epoch)")
    parser.add_argument("--models", default="demo,large,gpt2")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--variant", default="", help="refddp flags for a third loop")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="both loops")
    parser.add_argument("--compile", action="store_true", help="torch.compile both loops' model")
    parser.add_argument("--name", default="step_overhead", help="results/NAME.json")
    parser.add_argument("--unread", action="store_true",
                        help="a loop of refddp's step without its host read (a bound; one rank)")
    parser.add_argument("--profile", metavar="DIR", help="then one block of each loop profiled, to DIR")
    parser.add_argument("--rank-main", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.unread and args.ranks != "1":
        parser.error("--unread measures one process: give --ranks 1")
    if args.rank_main:
        rank_main(args.rank_main[0], args, args.rank_main[1])
        return
    load_before = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results, rows = [], []
    for model in args.models.split(","):
        for ranks in map(int, args.ranks.split(",")):
            with tempfile.TemporaryDirectory() as out:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", str(ranks), os.path.abspath(__file__),
                       "--blocks", str(args.blocks), "--steps", str(args.steps),
                       "--device", args.device, "--variant", args.variant, "--amp", args.amp,
                       *(["--compile"] if args.compile else []),
                       *(["--unread"] if args.unread else []),
                       *(["--profile", os.path.join(args.profile, f"{model}_{ranks}")]
                         if args.profile else []),
                       "--rank-main", model, out]  # fmt: skip
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                                      cwd=os.path.dirname(HERE))  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"{model} at {ranks} rank(s) failed:\n{proc.stderr[-3000:]}")
            measured = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
            times, faults = measured["times"], measured["faults"]
            med = {k: statistics.median(v) for k, v in times.items()}
            paired = statistics.median(a / b for a, b in zip(times["refddp"], times["plain"], strict=True))
            entry = {"model": model, "ranks": ranks, "amp": args.amp, "compile": args.compile,
                     "median_step_s": med, "blocks": times,
                     "throughput_vs_plain": med["plain"] / med["refddp"],
                     "paired_throughput_vs_plain": 1 / paired,
                     "overhead_us_per_step": (med["refddp"] - med["plain"]) * 1e6,
                     "minor_page_faults_per_step": {k: statistics.median(v)
                                                    for k, v in faults.items()},
                     "allocator_env": allocator_env(dict(os.environ))}  # fmt: skip
            results.append(entry)
            rows.append(
                f"{model:6} {ranks} rank(s) | step: refddp {med['refddp'] * 1e3:7.3f} ms, plain "
                f"{med['plain'] * 1e3:7.3f} ms | refddp/plain throughput "
                f"{entry['throughput_vs_plain']:.3f}x (paired blocks {entry['paired_throughput_vs_plain']:.3f}x)"
                f" | overhead {entry['overhead_us_per_step']:+.0f} us/step | page faults a step: "
                + ", ".join(f"{k} {v:.0f}" for k, v in entry["minor_page_faults_per_step"].items())
            )
            if "variant" in med:
                entry["variant"] = args.variant
                entry["variant_throughput_vs_plain"] = med["plain"] / med["variant"]
                rows[-1] += (f" | variant ({args.variant}) {med['variant'] * 1e3:7.3f} ms, "
                             f"{entry['variant_throughput_vs_plain']:.3f}x")  # fmt: skip
            if "unread" in med:
                entry["unread_throughput_vs_plain"] = med["plain"] / med["unread"]
                rows[-1] += (f" | unread {med['unread'] * 1e3:7.3f} ms, "
                             f"{entry['unread_throughput_vs_plain']:.3f}x")  # fmt: skip
            print(rows[-1], flush=True)
    header = (f"median time per training step, {args.blocks} alternating blocks of {args.steps} steps "
              f"per loop, in one process per rank ({args.device}, amp {args.amp}, "
              f"compile {args.compile})")  # fmt: skip
    write(args.name, results, "\n".join([header, *rows]), load_before)


if __name__ == "__main__":
    main()
