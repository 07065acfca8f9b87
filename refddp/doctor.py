"""``python -m refddp.doctor``: the DDP debugging checklist as one command.

Every rank reports in; a monitored barrier names any rank that does not arrive; all-reduce
latency and bandwidth are measured; the shards a training config would give each rank are
checked for emptiness, unevenness and padding; a few training steps of that config are timed
on every rank (its compute and data wait: who would hold the others back). Prints a per-rank
table (or ``--json``) and exits non-zero, with the reason, when something is wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from refddp.config.command_line import load_yaml, merge, parse_cli
from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import per_rank_batch_size, seconds_error
from refddp.launch.dist import init_distributed, rank0_then_meet, teardown, under_torchrun
from refddp.launch.exits import end_process
from refddp.launch.network_checks import check_node, duplicate_host_names
from refddp.launch.torchrun import launch
from refddp.training.stragglers import straggler_fields
from refddp.workload.data import build_datasets

ENV_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TORCHELASTIC_RESTART_COUNT",
)
SIZES = (4, 4096, 1 << 20)  # float32 elements: latency-bound to bandwidth-bound


class DoctorFailure(RuntimeError):
    """A check that cannot go on (a rank missing at the barrier)."""


def _rank_report(device: torch.device) -> dict[str, Any]:
    report: dict[str, Any] = {
        "rank": dist.get_rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        "host": socket.gethostname(),
        "node_rank": int(os.environ.get("GROUP_RANK", 0)),  # torchrun's node rank
        "pid": os.getpid(),
        "device": str(device),
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        report["gpu"] = {
            "name": torch.cuda.get_device_name(device),
            "memory_free_gb": free / 2**30,
            "memory_total_gb": total / 2**30,
        }
    return report


def _allreduce_timings(device: torch.device, repeats: int) -> list[dict[str, float]]:
    rows = []
    for size in SIZES:
        t = torch.ones(size, device=device)
        dist.all_reduce(t)  # warm-up: connections, buffers
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - start) / repeats
        n = dist.get_world_size()
        # Bus bandwidth: the bytes each rank moves in a ring all-reduce, per second.
        bus = 2 * (n - 1) / n * size * 4 / seconds if n > 1 else 0.0
        rows.append({"elements": size, "latency_ms": seconds * 1e3, "bus_gb_per_s": bus / 1e9})
    return rows


def _shard_report(c: TrainConfig) -> dict[str, Any]:
    """What the trainer's samplers would give every rank for this config."""
    world = dist.get_world_size()
    train, val = build_datasets(c)
    n_train, n_val = len(train), len(val)  # type: ignore[arg-type]
    batch = per_rank_batch_size(c, world)
    global_batch = batch * world * c.grad_accum
    steps = n_train // global_batch
    val_counts = [len(range(r, n_val, world)) for r in range(world)]
    plain_sampler_padding = (-n_train) % world  # what a default DistributedSampler would repeat
    problems = []
    if steps == 0:
        problems.append(
            f"the {n_train} training samples do not fill one global batch of "
            f"{global_batch}: every rank would have an empty shard"
        )
    if min(val_counts) == 0:
        problems.append(f"validation set of {n_val} leaves {val_counts.count(0)} rank(s) empty")
    return {
        "train_samples": n_train,
        "val_samples": n_val,
        "per_rank_batch": batch,
        "global_batch": global_batch,
        "steps_per_epoch": steps,
        "train_samples_per_rank": steps * batch * c.grad_accum,
        "train_samples_dropped_per_epoch": n_train - steps * global_batch,
        "val_samples_per_rank": val_counts,
        "plain_distributed_sampler_padding": plain_sampler_padding,
        "problems": problems,
    }


def _model_report(c: TrainConfig, ctx: Any) -> dict[str, Any]:
    """The model under ``c.strategy``: what each rank stores (FSDP: its shard)."""
    from refddp.training.parallel import build_parallel
    from refddp.workload.models import build_model

    model = build_model(c).to(ctx.device)
    total = sum(p.numel() for p in model.parameters())
    parallel = build_parallel(model, c, ctx)
    per_rank: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(per_rank, parallel.local_numel())  # any backend, NCCL included
    element = next(model.parameters()).element_size()
    # parameters + gradients + optimizer state (AdamW: two moments; SGD: one momentum buffer)
    copies = 2 + (2 if c.optimizer == "adamw" else 1)
    return {
        "model": c.model,
        "strategy": c.strategy,
        "parameters": total,
        "parameters_per_rank": per_rank,
        "state_mb_per_rank": [n * element * copies / 2**20 for n in per_rank],
    }


def _step_report(c: TrainConfig, ctx: Any, steps: int) -> dict[str, Any]:
    """Each rank's time per training step of ``c`` over ``steps`` steps, after one to warm up
    (optimizer state, DDP's buckets): the step itself, which every rank spends waiting for the
    slowest, and its own compute and data wait, which say who that is."""
    from refddp.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:  # the trial run's files (rank 0's config.yaml)
        trial = dataclasses.replace(c, task="train", out=out, resume="never", init_from="",
                                    log_to="jsonl", profile="", progress=False)  # fmt: skip
        trainer = Trainer(trial, ctx)
        batches = trainer.epoch_batches()
        steps = min(steps, trainer.sampler.steps_per_epoch - 1)
        trainer.train_step(batches)
        trainer.settle()
        trainer.window = trainer.open_window()
        started = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(batches)
        trainer.settle()
        step_s = (time.perf_counter() - started) / steps
        compute, data_wait, _ = trainer.window.rank_times()
        del batches, trainer
    mine = [step_s, compute / steps, data_wait / steps]
    per_rank: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(per_rank, mine)
    summed = [r[1] for r in per_rank] + [r[2] for r in per_rank]  # stragglers' layout
    return {
        "steps": steps,
        "per_rank": [{"rank": r, "step_ms": t[0] * 1e3, "compute_ms": t[1] * 1e3,
                      "data_wait_ms": t[2] * 1e3} for r, t in enumerate(per_rank)],  # fmt: skip
        **straggler_fields(summed),
    }


def roll_call(timeout_s: float) -> None:
    """Every rank reports in; the ranks that do not arrive within ``timeout_s`` are named.

    ``monitored_barrier`` exists only on gloo: a job on another backend (NCCL on GPUs, or a
    ``cpu:gloo,cuda:nccl`` group) holds its roll call on a gloo side group of every rank.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    side = None
    try:
        if dist.get_backend() != dist.Backend.GLOO:
            side = dist.new_group(backend="gloo", timeout=timeout)
        dist.monitored_barrier(side, timeout=timeout, wait_all_ranks=True)
    except (RuntimeError, ValueError) as exc:  # DistError is a RuntimeError
        raise DoctorFailure(f"barrier failed: {str(exc).strip().splitlines()[0]}") from None
    finally:
        if side is not None:
            dist.destroy_process_group(side)


def check(
    c: TrainConfig, barrier_timeout_s: float, repeats: int, steps: int = 5
) -> dict[str, Any]:
    """Run every check on this rank; the gathered result is complete on every rank."""
    ctx = init_distributed(c.device, timeout_s=max(barrier_timeout_s * 4, 60))
    device = torch.device(ctx.device)
    problems: list[str] = []
    roll_call(barrier_timeout_s)
    reports: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(reports, _rank_report(device))
    timings = _allreduce_timings(device, repeats)
    shards = _shard_report(c)
    problems += shards["problems"]
    model = _model_report(c, ctx)
    timed = _step_report(c, ctx, steps) if shards["steps_per_epoch"] > steps and steps else None
    hosts = {r["host"] for r in reports}
    problems += duplicate_host_names(reports)
    if c.device != "cpu" and torch.cuda.is_available():
        devices = [(r["host"], r["device"]) for r in reports]
        if len(set(devices)) < len(devices):
            problems.append("several ranks share one GPU")
    result = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "hosts": sorted(hosts),
        "ranks": reports,
        "all_reduce": timings,
        "shards": shards,
        "model": model,
        "step_times": timed,
        "problems": problems,
    }
    return result  # still in the group: main prints the report, then every rank leaves


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"world size {result['world_size']}, backend {result['backend']}, "
        f"hosts {', '.join(result['hosts'])}",
        "",
        f"{'rank':>4} {'local':>5} {'host':<16} {'pid':>8} {'device':<8} {'threads':>7}  gpu",
    ]
    for r in result["ranks"]:
        gpu = r.get("gpu")
        gpu_text = (
            f"{gpu['name']} {gpu['memory_free_gb']:.1f}/{gpu['memory_total_gb']:.1f} GiB free"
            if gpu
            else "-"
        )
        lines.append(
            f"{r['rank']:>4} {r['local_rank']:>5} {r['host'][:16]:<16} {r['pid']:>8} "
            f"{r['device']:<8} {r['threads']:>7}  {gpu_text}"
        )
    lines += ["", "all_reduce (float32):"]
    for row in result["all_reduce"]:
        lines.append(
            f"  {row['elements']:>9} elements  {row['latency_ms']:8.3f} ms  "
            f"{row['bus_gb_per_s']:8.3f} GB/s bus"
        )
    s = result["shards"]
    lines += [
        "",
        f"shards: {s['train_samples']} train samples, global batch {s['global_batch']} "
        f"({s['per_rank_batch']} per rank), {s['steps_per_epoch']} steps per epoch, "
        f"{s['train_samples_per_rank']} samples per rank, "
        f"{s['train_samples_dropped_per_epoch']} dropped per epoch",
        f"        validation per rank: {s['val_samples_per_rank']} (no padding); a plain "
        f"DistributedSampler would pad {s['plain_distributed_sampler_padding']} duplicate(s)",
    ]
    m = result["model"]
    lines += [
        "",
        f"model: {m['model']}, {m['parameters']:,} parameters, strategy {m['strategy']}; "
        "stored per rank (parameters; with gradients and optimizer state):",
        *(
            f"  rank {r}: {n:,} ({mb:.2f} MB)"
            for r, (n, mb) in enumerate(
                zip(m["parameters_per_rank"], m["state_mb_per_rank"], strict=True)
            )
        ),
    ]
    lines += _format_step_times(result.get("step_times"))
    env = result["ranks"][0]["env"]
    lines += ["", "environment (rank 0): " + (", ".join(f"{k}={v}" for k, v in env.items()) or "-")]
    lines += [""] + ([f"PROBLEM: {p}" for p in result["problems"]] or ["OK: no problems found"])
    return "\n".join(lines)


def _format_step_times(timed: dict[str, Any] | None) -> list[str]:
    if not timed:
        return []
    lines = ["", f"training steps ({timed['steps']} timed after one to warm up; every rank "
             "waits for the slowest, whose compute + data wait is the largest):"]  # fmt: skip
    lines += [f"  rank {r['rank']}: step {r['step_ms']:.2f} ms, compute {r['compute_ms']:.2f} ms, "
              f"data wait {r['data_wait_ms']:.2f} ms" for r in timed["per_rank"]]  # fmt: skip
    if "slowest_rank" in timed:
        lines.append(
            f"  slowest: rank {timed['slowest_rank']}, {timed['straggler_lag_s'] * 1e3:+.2f} ms "
            f"per step ({timed['straggler_lag_share']:+.0%}) against the median of the others"
        )
    return lines


ARGV_ENV = "REFDDP_DOCTOR_ARGV"  # the launcher's command line, as JSON, for its ranks


def network_report(as_json: bool) -> int:
    """``--network``: this node's checks, printed; 1 if any found a problem."""
    result = check_node()
    if as_json:
        print(json.dumps(result, indent=2))
    elif result["interfaces"]:
        gloo = result["gloo"]
        print(f"node {result['node']}: interfaces "
              + ", ".join(f"{n} {a}" for n, a in result["interfaces"].items()))  # fmt: skip
        print(f"  gloo listens on {gloo['interface']} {gloo['address']} (from {gloo['from']})")
        print(f"  MASTER_ADDR:MASTER_PORT: {result['master']}")
    if not as_json:
        lines = [f"PROBLEM: {p}" for p in result["problems"]] or ["OK: no problems found"]
        print("\n".join(lines))
    return 1 if result["problems"] else 0


def bad_options(args: argparse.Namespace) -> str:
    """The doctor's own options' errors, one line naming the flag ("" if none): a NaN
    ``--barrier-timeout`` failed every rank in a traceback, ``--repeats 0`` divided by 0."""
    if seconds_error(args.barrier_timeout):
        return f"--barrier-timeout: {seconds_error(args.barrier_timeout)}"
    if args.repeats < 1:
        return f"--repeats: must be >= 1, got {args.repeats}"
    for flag in ("steps", "nproc"):
        if getattr(args, flag) < 0:
            return f"--{flag}: must be >= 0, got {getattr(args, flag)}"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refddp.doctor", description=__doc__)
    parser.add_argument(
        "--nproc",
        type=int,
        default=0,
        help="local ranks to start (default: one per GPU, else 2); ignored under torchrun",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--barrier-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for every rank at the first barrier",
    )
    parser.add_argument("--repeats", type=int, default=20, help="all-reduces timed per size")
    parser.add_argument(
        "--steps", type=int, default=5, help="training steps timed per rank (0: none)"
    )
    parser.add_argument(
        "--config",
        help="training YAML whose data/batch settings to check; "
        "training flags (--batch-size, --data, ...) work too",
    )
    parser.add_argument(
        "--network",
        action="store_true",
        help="check this node's network for a multi-node job, without starting ranks: where "
        "gloo will listen, whether the host name resolves to this node, whether MASTER_ADDR:"
        "MASTER_PORT is reachable; run it on every node",
    )
    if argv is None:
        argv = json.loads(os.environ[ARGV_ENV]) if ARGV_ENV in os.environ else sys.argv[1:]
    args, rest = parser.parse_known_args(argv)
    why = bad_options(args)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    if args.network:
        return network_report(args.json)
    try:
        cli, _ = parse_cli(rest)
        c = merge(cli, load_yaml(args.config) if args.config else {})
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not under_torchrun():
        nproc = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
        return launch("refddp.doctor", {ARGV_ENV: json.dumps(argv)}, nproc, 0, c.out, job="doctor")
    try:
        result = check(c, args.barrier_timeout, args.repeats, args.steps)
        # Before any rank leaves: a rank that exits 1 (problems found) makes the launcher stop
        # the others, and rank 0 must have printed the report by then.
        report = json.dumps(result, indent=2) if args.json else format_table(result)
        rank0_then_meet(lambda: print(report, flush=True))
    except DoctorFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        teardown()  # on every path: no gloo thread left running at exit
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    end_process(main)
