"""The trainer's invariants and the harness's reports at the world size users deploy.

64 ranks (real processes, real gloo collectives, one machine): the shards
are disjoint and cover the data, evaluation sees every sample once (with ranks that have no
evaluation sample at all), a stop signal on one rank stops all of them at one step, a
non-finite gradient on one rank skips the step everywhere, exact token normalisation holds,
and the weights equal one process's on the same global batches. A failure among them reads as
one cause and one line of grouped victims. The trainer's scenarios are ``slow`` (``make
test-all``); the same scenario at 256 ranks also runs there and with ``make scale``
(``REFDDP_LARGE_WORLDS=1``: 4 minutes of both cores); ``benchmarks/harness_scale.py`` takes the
harness itself to 1,024.
"""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch
import torch.distributed as dist

from refddp.testing import RankFailure
from refddp.testing.rank_lists import parse_rank_list
from refddp.workload.models import build_model
from refddp.workload.objectives import PROBE_SAMPLES
from tests.rank_tasks import (
    TOKENS,
    assert_in_step,
    eval_model,
    fit_recording,
    raises_after_one_all_reduce,
    run_scenario,
    tiny_config,
)

pytestmark = pytest.mark.heavy  # 64 ranks (256 with REFDDP_LARGE_WORLDS) load both cores
WORLD = 64
TIMEOUT = 240  # a 64-rank pool starts in seconds; the first trainer run also connects its pairs


@pytest.mark.slow  # 64 ranks training: ~35 s
def test_at_64_ranks_the_shards_are_disjoint_cover_the_data_and_reshuffle(spawn, tmp_path):
    per_rank, steps = 2, 3
    size = WORLD * per_rank * steps + 37  # a tail that fills no global batch: dropped
    steps_done = spawn(fit_recording, str(tmp_path / "run"), str(tmp_path), world_size=WORLD,
                       timeout=TIMEOUT, train_size=size, global_batch_size=WORLD * per_rank,
                       epochs=2, val_size=WORLD)  # fmt: skip
    assert steps_done == [2 * steps] * WORLD
    probe = min(PROBE_SAMPLES, tiny_config("unused").batch_size)
    seen = []
    for rank in range(WORLD):
        indices = [int(i) for i in (tmp_path / f"rank{rank}.txt").read_text().split()]
        assert indices[:probe] == list(range(probe)), "the objective's probe comes first"
        seen.append(indices[probe:])
    assert {len(s) for s in seen} == {2 * per_rank * steps}, "every rank, as many samples"
    epochs = [[s[e * per_rank * steps : (e + 1) * per_rank * steps] for s in seen] for e in (0, 1)]
    for shards in epochs:
        union = [i for shard in shards for i in shard]
        assert len(set(union)) == len(union) == WORLD * per_rank * steps, "disjoint shards"
        assert set(union) <= set(range(size))
    # Each epoch drops a different tail (its own shuffle), so each covers every sample it uses
    # once, and the two epochs are different draws.
    assert epochs[0] != epochs[1]


def test_at_64_ranks_evaluation_sees_every_sample_once_with_ranks_that_have_none(spawn):
    weights = build_model(tiny_config("unused")).state_dict()
    one = spawn(eval_model, weights, world_size=1)[0]
    many = spawn(eval_model, weights, world_size=WORLD, timeout=TIMEOUT)  # 37 samples, 64 ranks
    assert one["num_samples"] == 37
    for metrics in many:
        assert metrics["num_samples"] == 37
        assert metrics["val_acc"] == one["val_acc"]
        assert metrics["val_loss"] == pytest.approx(one["val_loss"], rel=1e-12)


LARGE = pytest.mark.skipif(not os.environ.get("REFDDP_LARGE_WORLDS"),
                           reason="256 ranks take 4 minutes of both cores: make test-all, "
                                  "make scale")  # fmt: skip


@pytest.mark.parametrize(
    ("world", "timeout"),
    [pytest.param(WORLD, TIMEOUT, marks=pytest.mark.slow),  # ~30 s
     pytest.param(256, 900, marks=[pytest.mark.slow, pytest.mark.timeout(1800), LARGE])],
)  # fmt: skip
def test_a_signal_and_a_nonfinite_gradient_keep_the_ranks_in_step(spawn, tmp_path, world, timeout):
    """One trainer scenario at ``world`` ranks against one process: padded token sequences
    (the step agrees on the global target count), a NaN gradient behind a finite loss on the
    last rank at step 3, SIGUSR1 on a middle rank after step 2, a resume, uneven evaluation
    shards (fewer samples than ranks); equal collectives, steps and skips on every rank, and
    one process's weights."""
    per_rank, steps = 1, 6
    job = dict(TOKENS, train_size=world * per_rank * steps + 3, val_size=world // 2 + 1,
               global_batch_size=world * per_rank, epochs=1, eval_every=3, ckpt_every=0,
               grad_clip=0.5, optimizer="sgd", lr=0.1, dropout=0.0)  # fmt: skip
    faults = {(world - 1, 3): "gradient"}
    reference = spawn(run_scenario, str(tmp_path / "one"), {(0, 3): "gradient"}, None,
                      world_size=1, **job)[0]  # fmt: skip
    assert (reference["step"], reference["skipped"]) == (steps, 1)
    out = str(tmp_path / "run")
    run = spawn(run_scenario, out, faults, (world // 2, 2, "SIGUSR1"), world_size=world,
                timeout=timeout, **job)  # fmt: skip
    assert_in_step(run)
    assert (run[0]["step"], run[0]["stopped_by"]) == (3, signal.SIGUSR1), "stopped together"
    assert run[0]["skipped"] == 1, "step 3, the NaN's, ran before the stop"
    run = spawn(run_scenario, out, faults, None, world_size=world, timeout=timeout, **job)
    assert_in_step(run)
    assert run[0]["step"] == steps and run[0]["skipped"] == 1  # (counted across the resume)
    for key, value in reference["weights"].items():
        torch.testing.assert_close(run[0]["weights"][key], value, rtol=1e-9, atol=1e-12, msg=key)


def test_at_64_ranks_a_failure_reads_as_its_cause_and_one_line_of_victims(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(raises_after_one_all_reduce, 17, world_size=WORLD, timeout=TIMEOUT)
    report = str(info.value)
    lines = report.splitlines()
    assert info.value.cause == 17
    assert lines[0].startswith("rank 17 failed first: ValueError: rank 17's own bug"), lines[0]
    # One line for the ranks waiting in #2; a rank still on its way there when rank 17 failed
    # (64 ranks on 2 cores) gets a line of its own. Every other rank is named, once.
    details = lines[1 : lines.index(next(ln for ln in lines if ln.startswith("--- ")))]
    named = [parse_rank_list(re.match(r"    ranks? (\[[^\]]*\]|\d+)", ln)[1]) for ln in details]
    assert sorted(r for ranks in named for r in ranks) == [r for r in range(WORLD) if r != 17]
    assert ": waiting on rank 17 in #2 all_reduce(" in lines[1] and len(named[0]) >= WORLD // 2
    assert len(details) <= 4, report
    # One traceback, one stack for the ranks waiting (thread ids aside, theirs are equal).
    assert report.count("--- ") <= 6, report
    assert len(lines) < 100, f"{len(lines)} lines"


def half_all_reduce_half_broadcast() -> None:
    if dist.get_rank() < WORLD // 2:
        dist.all_reduce(torch.ones(2))
    else:
        dist.broadcast(torch.ones(2), src=0)


def test_at_64_ranks_a_collective_mismatch_names_the_two_groups_not_64_lines(spawn):
    with pytest.raises(RankFailure) as info:
        spawn(half_all_reduce_half_broadcast, world_size=WORLD, timeout=TIMEOUT)
    report = str(info.value)
    assert ("ranks [0-31] (32) are running #1 all_reduce((2,):float32, SUM); "
            "ranks [32-63] (32) are running #1 broadcast((2,):float32, src=0)") in report
    assert len(report.splitlines()) < 60, report
