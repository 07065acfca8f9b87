"""Per-rank memory and throughput of DDP vs FSDP2 (refddp.training.parallel) at 1, 2 and 4 gloo ranks.

    python benchmarks/fsdp_memory.py [--hidden 4096] [--depth 4] [--steps 4] [--ranks 1,2,4]

A float32 MLP of a few hundred MB trained with AdamW through refddp's own strategies. Per rank:
the bytes of parameters, gradients and optimizer state it holds (what sharding divides), peak
RSS, and training samples/s. Goal (issue 14): FSDP's state per rank within 10% of 1/N of DDP's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PER_RANK_BATCH = 32


def tensor_bytes(t) -> int:  # type: ignore[no-untyped-def]
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def rank_main(args: argparse.Namespace) -> None:
    """One rank: build, wrap, train a few steps, report its own numbers as a JSON line."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from refddp.config.schema import TrainConfig
    from refddp.launch.dist import DistContext
    from refddp.training.parallel import build_parallel
    from refddp.workload.models import build_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = TrainConfig(input_dim=args.hidden, hidden_size=args.hidden, depth=args.depth,
                    num_classes=16, strategy=args.strategy)  # fmt: skip
    parallel = build_parallel(build_model(c), c, DistContext(rank, world, rank, "cpu", "gloo"))
    opt = torch.optim.AdamW(parallel.model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(PER_RANK_BATCH, args.hidden, generator=g)
    y = torch.randint(0, 16, (PER_RANK_BATCH,), generator=g)
    times = []
    for _ in range(args.steps + 1):  # the first step (allocation, lazy state) is not timed
        dist.barrier()
        start = time.perf_counter()
        loss = F.cross_entropy(parallel.module(x), y)
        parallel.backward(loss, torch.ones_like(loss))  # DDP: the step flags' carrier too
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep gradients allocated: they are part of the state
        times.append(time.perf_counter() - start)
    params = parallel.model.parameters()
    state = {
        "parameters": sum(tensor_bytes(p) for p in params),
        "gradients": sum(tensor_bytes(p.grad) for p in parallel.model.parameters()),
        "optimizer": sum(
            tensor_bytes(v) for s in opt.state.values() for v in s.values() if v.dim() > 0
        ),
    }
    report = {
        "rank": rank,
        "state_bytes": state,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "samples_per_s": PER_RANK_BATCH * world * args.steps / sum(times[1:]),
    }
    print("RESULT " + json.dumps(report), flush=True)
    dist.destroy_process_group()


def run(strategy: str, ranks: int, args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(ranks), os.path.abspath(__file__), "--rank-main",
           "--strategy", strategy, "--hidden", str(args.hidden), "--depth", str(args.depth),
           "--steps", str(args.steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory():
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.dirname(HERE))
    if proc.returncode:
        raise SystemExit(f"{strategy} at {ranks} ranks failed:\n{proc.stderr[-3000:]}")
    lines = [ln[len("RESULT ") :] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return sorted((json.loads(ln) for ln in lines), key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ranks", default="1,2,4")
    args = parser.parse_args()
    if args.rank_main:
        return rank_main(args)
    from record import write

    results, rows = [], []
    for ranks in map(int, args.ranks.split(",")):
        per_strategy = {s: run(s, ranks, args) for s in ("ddp", "fsdp")}
        ddp_state = max(sum(r["state_bytes"].values()) for r in per_strategy["ddp"])
        for strategy, reports in per_strategy.items():
            state = max(sum(r["state_bytes"].values()) for r in reports)  # the largest rank
            entry = {
                "strategy": strategy,
                "ranks": ranks,
                "state_mb_per_rank": state / 2**20,
                "state_vs_ddp_over_n": state / (ddp_state / ranks),
                "peak_rss_mb_per_rank": max(r["peak_rss_mb"] for r in reports),
                "samples_per_s": reports[0]["samples_per_s"],
                "per_rank": reports,
            }
            results.append(entry)
            rows.append(
                f"{strategy:4} {ranks} rank(s): state {entry['state_mb_per_rank']:7.1f} MB/rank "
                f"({entry['state_vs_ddp_over_n']:.3f}x DDP/N), peak RSS "
                f"{entry['peak_rss_mb_per_rank']:7.0f} MB/rank, {entry['samples_per_s']:6.1f} samples/s"
            )
            print(rows[-1], flush=True)
    header = (f"MLP hidden {args.hidden} depth {args.depth} (float32, AdamW), per-rank batch "
              f"{PER_RANK_BATCH}, {args.steps} timed steps")  # fmt: skip
    write("fsdp_memory", results, "\n".join([header, *rows]))


if __name__ == "__main__":
    main()
