"""The trainer under faults the harness injects at an exact collective, and on simulated nodes:
a rank killed inside a checkpoint's gather, a straggler during evaluation, `--out` on
node-local disks."""

import os

import pytest
import torch

from refddp.launch.dist import init_distributed
from refddp.testing import RankFailure, faults, rank_context
from refddp.train import take_rank0_run_config
from refddp.training.trainer import Trainer
from refddp.training.watchdog import HangWatchdog
from tests.rank_tasks import fit, fit_recording_collectives, state_of, tiny_config

# A stop check never due: the ranks' agreement all-reduces come with the stop check, due every
# stop_check_s of training (by default 0.1 s), so a slower run would make more of them, and a
# collective's number in the recorded run would name another in the run under the fault.
FLAGS = {"epochs": 2, "ckpt_every": 4, "stop_check_s": 3600}


def nth(log, signature, n):
    """The number (#k, from 1) of the n-th collective of ``signature`` in ``log``."""
    return [k for k, s in enumerate(log, 1) if s == signature][n - 1]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_rank_killed_inside_a_checkpoint_gather_keeps_the_last_checkpoint_and_the_rerun_matches(
    spawn, tmp_path
):
    straight = spawn(fit, str(tmp_path / "straight"), **FLAGS)[0]
    log = spawn(fit_recording_collectives, str(tmp_path / "recorded"), **FLAGS)[0]["log"]
    # Each save gathers every rank's RNG state and loss (an all_gather_object): the saves at
    # steps 4, 8, ..., 24 make the last six of the run's. Kill rank 1 inside the step-8 save's.
    gathers = [k for k, s in enumerate(log, 1) if s == "all_gather_object()"]
    k = gathers[-6:][1]
    out = tmp_path / "run"
    with pytest.raises(RankFailure) as info:
        spawn(fit, str(out), **FLAGS, faults=[faults.kill(1, k)], timeout=60)
    assert info.value.cause == 1
    assert f"injected: kill rank 1 at collective #{k} all_gather_object()" in str(info.value)
    latest = torch.load(out / "checkpoints" / "checkpoint_latest.pth", weights_only=True)
    assert latest["step"] == 4, "the save under way never replaced the last complete one"
    rerun = spawn(fit, str(out), **FLAGS)[0]
    assert rerun["step"] == straight["step"] == 24
    assert_same_weights(rerun["weights"], straight["weights"])


def fit_watched(out, flags):
    """``fit`` under the hang watchdog, as ``python -m refddp.train`` runs a rank."""
    c = tiny_config(out, **flags)
    rank = torch.distributed.get_rank()
    with HangWatchdog(os.path.join(out, f"stacks-rank{rank}.txt"), c.timeout) as watchdog:
        trainer = Trainer(c, init_distributed("cpu"), watchdog)
        result = trainer.fit()
    return {"weights": state_of(trainer.model), "metrics": result["metrics"]}


def test_a_straggler_during_evaluation_changes_nothing_and_trips_no_watchdog(spawn, tmp_path):
    flags = {"epochs": 2, "timeout": 4.0, "stop_check_s": 3600}  # (see FLAGS)
    straight = spawn(fit_watched, str(tmp_path / "straight"), flags)
    log = spawn(fit_recording_collectives, str(tmp_path / "recorded"), **flags)[0]["log"]
    # The first evaluation's sums: the objective's four, samples and the stop flag.
    k = nth(log, "all_reduce((6,):float64, SUM)", 1)
    late = spawn(fit_watched, str(tmp_path / "late"), flags, faults=[faults.delay(1, k, 1.5)])
    results = ("epoch", "step", "train_loss", "val_loss", "val_acc")  # not times or memory
    same = [{k: r["metrics"][k] for k in results} for r in (late[0], straight[0])]
    assert same[0] == same[1]
    assert_same_weights(late[1]["weights"], straight[1]["weights"])


def fit_on_node(flags, given_by_rank):
    """One rank of a job whose --out is node-local (this node's node_tmp_path): its command gave
    ``given_by_rank[rank]`` of ``flags``; the rest it leaves to rank 0, as ``run_rank`` does."""
    ctx = rank_context()
    given = given_by_rank[ctx.rank]
    c = tiny_config(str(ctx.node_tmp_path), **{k: v for k, v in flags.items() if k in given})
    c = take_rank0_run_config(c, set(given), ctx.rank, ctx.world_size)
    trainer = Trainer(c, init_distributed("cpu"))
    result = trainer.fit()
    return {"weights": state_of(trainer.model), "step": result["step"], "lr": c.lr,
            "hidden_size": c.hidden_size}  # fmt: skip


def test_two_nodes_with_node_local_out_resume_from_rank_0s_state_and_config(spawn, tmp_path):
    job = {"lr": 0.02, "hidden_size": 32}
    everything = [list(job), list(job)]
    first = spawn(fit_on_node, {**job, "stop_after": 5}, [[*job, "stop_after"]] * 2, nnodes=2)
    assert first[0]["step"] == 5
    node0, node1 = (rank_context_dirs := spawn(node_dirs, nnodes=2))[0], rank_context_dirs[1]
    assert os.listdir(os.path.join(node0, "checkpoints")), "rank 0 saved on node 0's disk"
    assert not os.path.exists(os.path.join(node1, "checkpoints")), "node 1 has no checkpoint"
    # The rerun on node 1 leaves lr and the model's width out (they are in rank 0's checkpoint).
    rerun = spawn(fit_on_node, job, [list(job), []], nnodes=2)
    assert [(r["lr"], r["hidden_size"]) for r in rerun] == [(0.02, 32)] * 2
    assert rerun[0]["step"] == rerun[1]["step"] == 24
    straight = spawn(fit_on_node, job, everything, nnodes=1)
    assert_same_weights(rerun[1]["weights"], straight[0]["weights"])


def node_dirs():
    return str(rank_context().node_tmp_path)
