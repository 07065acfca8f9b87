"""Ranks cannot fall out of step, and a skipped step leaves no trace: generated scenarios over
the space users run, checked for the invariants.

Each scenario draws a world size (1-4), the strategy (DDP or FSDP), the precision (float64;
float32 under amp bf16 or fp16), the model (an MLP; a conv net with BatchNorm, with or
without dropout; a token model whose loss is normalised by the global batch's target count), the
optimizer, batch sizes, the accumulation, clipping, DDP's ``find_unused_parameters`` and a
user's comm hook (fp16 compression), ``on_nonfinite`` (skip or stop), faults on any rank in
any micro-batch (those before the last run under ``no_sync``: a non-finite loss behind a
finite gradient, or a NaN gradient behind a finite loss), a stop signal on one rank after one
step or a ``stop_after`` point, and the evaluation and checkpoint cadence. The run, resumed
after its stop, must:

- issue the same collectives in the same order on every rank, and as many in all (the
  harness's record, and the group's sequence number, which counts DDP's own all-reduces),
  and never hang (the harness's deadline);
- end on every rank at the same step, with the same skips: every faulty step skipped (under
  fp16 GradScaler may skip overflows besides), or, with ``on_nonfinite=stop``, every rank
  stopped at the first fault it cannot absorb (under fp16 a NaN gradient reads as an overflow
  while the loss scale can fall, and is skipped);
- leave, at every skipped step, every rank's parameters, buffers, optimizer state, learning
  rates, schedule and update count exactly as they were;
- end, where resumed, bit-identical to the same scenario run uninterrupted; and where the
  guarantees say so (float64, no dropout, no BatchNorm, no lossy comm hook), with the weights
  and optimizer state of one process trained on the same global batches with the same faults.

The CPU suite runs 20 examples, the same each time (``REFDDP_SCENARIOS`` sets how many; past
25 they are drawn afresh); ``make stress`` runs 500.
"""

from __future__ import annotations

import os
import signal
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from refddp.config.torch_support import fsdp2_refused
from tests.rank_tasks import SIGNALS, TOKENS, assert_in_step, run_scenario
from tests.step_tasks import run_drawn_scenario

EXAMPLES = int(os.environ.get("REFDDP_SCENARIOS", "20"))
MODELS = {
    "mlp": {},
    "batchnorm": {"model": "convnet", "dropout": 0.0},
    "dropout": {"model": "convnet", "dropout": 0.3},  # (and BatchNorm)
    "tokens": TOKENS,
}
PRECISIONS = {
    "float64": {},
    "bf16": {"dtype": "float32", "amp": "bf16"},
    "fp16": {"dtype": "float32", "amp": "fp16"},
}
STRATEGIES = ["ddp"] if fsdp2_refused() else ["ddp", "fsdp"]  # (FSDP2 needs torch 2.6+)


@st.composite
def scenarios(draw) -> dict:
    world = draw(st.integers(1, 4))
    strategy = draw(st.sampled_from(STRATEGIES)) if world > 1 else "ddp"
    precision = draw(st.sampled_from(["float64", "bf16"] if strategy == "fsdp" else
                                     sorted(PRECISIONS)))  # fmt: skip
    model = draw(st.sampled_from(sorted(MODELS)))
    accum = draw(st.integers(1, 3))
    per_rank = draw(st.integers(1, 3))
    global_batch = world * accum * per_rank
    steps_per_epoch = draw(st.integers(2, 5))
    epochs = draw(st.integers(1, 2))
    total = steps_per_epoch * epochs
    ddp_across = strategy == "ddp" and world > 1
    fault_at = st.tuples(st.integers(0, world - 1), st.integers(1, total),
                         st.integers(0, accum - 1))  # fmt: skip
    faults = draw(st.dictionaries(fault_at, st.sampled_from(["loss", "gradient"]), max_size=2))
    on_nonfinite = draw(st.sampled_from(["skip", "stop"]))
    stop = draw(st.sampled_from(["none", "signal", "stop_after"])) if on_nonfinite == "skip" \
        else "none"  # fmt: skip
    signalled = None
    if stop == "signal":
        signalled = (draw(st.integers(0, world - 1)), draw(st.integers(1, total - 1)),
                     draw(st.sampled_from(sorted(SIGNALS))))  # fmt: skip
    return {
        "world": world,
        "faults": faults,
        "signalled": signalled,
        "stop_after": draw(st.integers(1, total - 1)) if stop == "stop_after" else 0,
        "comm_hook": ddp_across and draw(st.booleans()),
        "model": model,
        "precision": precision,
        "job": dict(
            MODELS[model],
            **PRECISIONS[precision],
            strategy=strategy,
            find_unused_parameters=ddp_across and draw(st.booleans()),
            train_size=global_batch * steps_per_epoch + draw(st.integers(0, global_batch - 1)),
            val_size=draw(st.integers(world, 13)),  # uneven evaluation shards too
            global_batch_size=global_batch,
            grad_accum=accum,
            epochs=epochs,
            eval_every=draw(st.integers(0, 4)),
            ckpt_every=draw(st.integers(0, 4)),
            grad_clip=draw(st.sampled_from([0.0, 0.5])),
            optimizer=draw(st.sampled_from(["sgd", "adamw"])),
            lr=0.05,
            on_nonfinite=on_nonfinite,
            # Every step, every check a step or more apart as timing says, or none but the
            # first: where a signal stops the run is then only known from the steps that met.
            stop_check_s=draw(st.sampled_from([0.0, 0.05, 60.0])),
        ),
        "total": total,
        "steps_per_epoch": steps_per_epoch,
    }


# Drawn rarely (a 2-step run, both steps faulty), always run: a run stopped after its first
# step resumes and fails at its end, having trained nothing (refddp/training/skips.py).
EVERY_STEP_FAULTY = {
    "world": 2, "faults": {(0, 1, 0): "loss", (1, 2, 0): "gradient"}, "signalled": None,
    "stop_after": 1, "comm_hook": False, "model": "mlp", "precision": "float64",
    "job": dict(strategy="ddp", find_unused_parameters=False, train_size=4, val_size=3,
                global_batch_size=2, grad_accum=1, epochs=1, eval_every=0, ckpt_every=0,
                grad_clip=0.0, optimizer="sgd", lr=0.05, on_nonfinite="skip",
                stop_check_s=0.0),
    "total": 2, "steps_per_epoch": 2,
}  # fmt: skip


def ends_in_a_settle(step: int, s: dict) -> bool:
    """Whether ``step`` ends in an evaluation or a checkpoint (so its stop signals are agreed
    at once): the trainer's ``end_of_step`` schedule, written out."""
    job = s["job"]
    return (
        step % s["steps_per_epoch"] == 0
        or step == s["total"]
        or bool(job["eval_every"] and step % job["eval_every"] == 0)
        or bool(job["ckpt_every"] and step % job["ckpt_every"] == 0)
    )


def first_stop_check(at: int, s: dict, met: list[int]) -> int:
    """The step at which a signal sent after step ``at`` stops the run: at once where ``at``
    ends in a settle, else at the first later step whose agreement met (``met``) or that ends
    in a settle."""
    if ends_in_a_settle(at, s):
        return at
    return next(step for step in range(at + 1, s["total"] + 1)
                if step in met or ends_in_a_settle(step, s))  # fmt: skip


def exact_against_one_process(s: dict) -> bool:
    """Where the guarantees promise one process's weights: float64, and nothing that makes a
    step depend on how the global batch is split (BatchNorm's per-rank statistics, per-rank
    dropout draws) or rounds the gradient (fp16 compression)."""
    return s["precision"] == "float64" and s["model"] in ("mlp", "tokens") and not s["comm_hook"]


def expected_end(s: dict) -> tuple[int | None, set[int]]:
    """With ``on_nonfinite=stop``: the step every rank stops at (None: no stop), and the
    faulty steps skipped before it. Under fp16 a NaN gradient behind finite losses reads as
    an overflow GradScaler can absorb (the scale stays far above min_loss_scale here)."""
    steps = sorted({step for (_, step, _) in s["faults"]})
    stopping = [step for step in steps if not (s["precision"] == "fp16" and all(
        kind == "gradient" for (_, at, _), kind in s["faults"].items() if at == step))]  # fmt: skip
    if s["job"]["on_nonfinite"] == "skip" or not stopping:
        return None, set(steps)
    return stopping[0], {step for step in steps if step <= stopping[0]}


def spawn_run(spawn, out: str, s: dict, signalled: tuple | None, stop_after: int) -> list[dict]:
    return spawn(run_drawn_scenario, out, s["faults"], signalled, s["comm_hook"],
                 world_size=s["world"], stop_after=stop_after, timeout=120,
                 **s["job"])  # fmt: skip


def assert_no_trace(run: list[dict]) -> None:
    for rank, found in enumerate(run):
        assert found["changed"] == {}, f"rank {rank}: a skipped step changed {found['changed']}"


def assert_bit_identical(a: dict, b: dict) -> None:
    for key, value in b.items():
        if torch.is_tensor(value):
            torch.testing.assert_close(a[key], value, rtol=0, atol=0, equal_nan=True, msg=key)
        elif isinstance(value, dict):
            assert_bit_identical(a[key], value)
        elif isinstance(value, list | tuple):  # (a checkpoint keeps AdamW's betas as a list)
            assert_bit_identical(dict(enumerate(a[key])), dict(enumerate(value)))
        else:
            assert a[key] == value, key


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 25,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(scenarios())
@example(EVERY_STEP_FAULTY)
def test_every_generated_scenario_keeps_the_ranks_in_step_and_leaves_skips_no_trace(spawn, s):
    stops_at, faulty = expected_end(s)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        run = spawn_run(spawn, out, s, s["signalled"], s["stop_after"])
        assert_in_step(run)
        assert_no_trace(run)
        skipped = set(run[0]["skipped_steps"])
        if stops_at is not None:
            assert run[0]["nonfinite_stop"] == stops_at, "every rank stops at the first fault"
            assert faulty <= skipped | {stops_at}
            return
        if s["signalled"]:
            expected = first_stop_check(s["signalled"][1], s, run[0]["met"])
            assert (run[0]["step"], run[0]["stopped_by"]) == (
                expected, SIGNALS[s["signalled"][2]]
            )  # fmt: skip
        elif s["stop_after"]:
            assert run[0]["step"] == s["stop_after"] and run[0]["stopped_by"] is None
        resumed = run[0]["step"] < s["total"]
        if resumed:  # stopped: the rerun resumes from its checkpoint
            run = spawn_run(spawn, out, s, None, 0)
            assert_in_step(run)
            assert_no_trace(run)
            skipped |= set(run[0]["skipped_steps"])
        assert run[0]["step"] == s["total"]
        # A run that skipped every step (faults, or fp16 overflows besides) fails at its end.
        trained_nothing = len(skipped) == s["total"]
        assert run[0]["nonfinite_stop"] == (s["total"] if trained_nothing else None)
        assert run[0]["skipped"] == len(skipped), "counted across the resume"
        if s["precision"] == "fp16":
            assert faulty <= skipped, "every faulty step skipped (and overflows besides)"
        else:
            assert skipped == faulty, "exactly the faulty steps, on every rank"
        if resumed:  # bit-identical to the same scenario, uninterrupted
            straight = spawn_run(spawn, os.path.join(tmp, "straight"), s, None, 0)
            assert_bit_identical(run[0]["weights"], straight[0]["weights"])
            assert_bit_identical(run[0]["optimizer"], straight[0]["optimizer"])
        if exact_against_one_process(s):
            one_faults = {(0, step, 0): kind for (_, step, _), kind in s["faults"].items()}
            one = spawn(run_drawn_scenario, os.path.join(tmp, "one"), one_faults, None, False,
                        world_size=1, **{**s["job"], "strategy": "ddp",
                                         "find_unused_parameters": False})[0]  # fmt: skip
            assert set(one["skipped_steps"]) == faulty
            for key, value in one["weights"].items():
                assert torch.isfinite(value).all(), key
            for ours, theirs in ((run[0]["weights"], one["weights"]),
                                 (run[0]["optimizer"]["state"], one["optimizer"]["state"])):
                torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("world_size", [3])
def test_a_signal_on_one_rank_mid_epoch_stops_every_rank_at_the_next_step(spawn, tmp_path,
                                                                          world_size):  # fmt: skip
    # An example the generator may or may not draw: rank 2 signalled after step 3 of 12, the
    # stop checked every step.
    found = spawn(run_scenario, str(tmp_path), {}, (2, 3, "SIGUSR1"), world_size=world_size,
                  global_batch_size=6, train_size=72, epochs=1, stop_check_s=0)  # fmt: skip
    assert_in_step(found)
    assert (found[0]["step"], found[0]["stopped_by"]) == (4, signal.SIGUSR1)
    assert found[0]["met"] == list(range(1, 5)), "every step met"


def test_steps_that_need_no_agreement_skip_it_and_a_signal_waits_for_the_next_check(spawn,
                                                                                   tmp_path):  # fmt: skip
    # A per-sample loss, nothing logged per step, a check every hour: after the first two
    # steps (the second measures how long a step takes) no step meets until the evaluation at
    # the end, where a signal sent after step 3 stops every rank.
    found = spawn(run_scenario, str(tmp_path), {}, (1, 3, "SIGTERM"), world_size=2,
                  global_batch_size=4, train_size=48, epochs=1, stop_check_s=3600)  # fmt: skip
    assert_in_step(found)
    assert found[0]["met"] == [1, 2]
    assert (found[0]["step"], found[0]["stopped_by"]) == (12, signal.SIGTERM)
