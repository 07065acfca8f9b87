"""The run-state rules of refddp/checkpoints/run_state.py: what a resumed run may change, and its batch."""

import pytest

from refddp.checkpoints import run_state
from refddp.checkpoints.run_state import CheckpointError
from refddp.config.schema import FIELDS, TrainConfig


def saved(**config):
    """The parts of a checkpoint the resume rules read: a run of global batch 8 on 1 rank."""
    return {"config": {**TrainConfig(batch_size=8).to_dict(), **config}, "world_size": 1}


def test_every_field_declares_its_policy_and_the_tables_derive_from_it():
    import refddp.config.schema as config

    policies = {name: f.metadata["resume"] for name, f in FIELDS.items()}
    assert set(policies.values()) == {config.APPLIED, config.REFUSED, config.DERIVED, None}
    assert run_state.ON_RESUME == {k: v for k, v in policies.items() if v is not None}
    assert config.IMPORT_FIELDS == ("model", "data", "loss", "metrics")
    assert config.JOINED_WITH == ("device", "timeout")
    with pytest.raises(TypeError, match="resume"):  # no field without a resume policy
        config._opt(0, "an option that forgot to say what a resume does with it")


def test_a_resumed_run_keeps_its_global_batch_unless_a_batch_size_is_given():
    state = saved()
    kept = run_state.continue_run(TrainConfig(batch_size=8), state, "c.pth", explicit=set())
    assert kept.global_batch_size == 8
    run_state.check_global_batch(kept, 2, state, "c.pth")  # 4 per rank at world size 2
    given = run_state.continue_run(TrainConfig(batch_size=4), state, "c.pth", explicit={"batch_size"})
    run_state.check_global_batch(given, 2, state, "c.pth")
    with pytest.raises(CheckpointError, match=r"= global batch 16, but .* has global batch 8"):
        run_state.check_global_batch(given, 4, state, "c.pth")


def test_a_refused_field_names_both_values():
    with pytest.raises(CheckpointError, match=r"^optimizer: .* has 'adamw', this .* 'sgd'"):
        run_state.continue_run(TrainConfig(optimizer="sgd"), saved(), "c.pth", explicit={"optimizer"})


def test_an_applied_field_may_change():
    state = saved()
    c = run_state.continue_run(TrainConfig(lr=0.5), state, "c.pth", explicit={"lr"})
    assert c.lr == 0.5
