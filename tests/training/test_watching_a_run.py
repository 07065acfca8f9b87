"""The observability options and their pieces without a process group: ``--log-to``,
``--profile`` and ``--log-every`` as config, the tracker fan-out, the straggler threshold."""

import pytest
import yaml

from refddp.config.command_line import load_yaml, merge, parse_cli
from refddp.config.schema import ConfigError, TrainConfig
from refddp.config.validation import list_items
from refddp.training import trackers as trackers_module
from refddp.training.stragglers import (
    LAG_SHARE,
    PERSISTENT,
    StragglerWatch,
    ranks_per_node,
    straggler_fields,
    whose,
)
from refddp.training.trackers.base import Run, Tracker, Trackers, record_scalars
from tests.cli_runs import run, train_command
from tests.tracker_files import board_events, board_wall_times, history, tensorboard_scalars


def test_log_to_takes_a_yaml_list_or_a_comma_separated_flag(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"log_to": ["tensorboard", "wandb"]}))
    c = merge({}, load_yaml(str(path)))
    assert list_items(c.log_to) == ["tensorboard", "wandb"]
    cli, _ = parse_cli(["--log-to", "wandb, tensorboard,wandb"])
    assert list_items(merge(cli, {}).log_to) == ["wandb", "tensorboard"]
    assert TrainConfig().log_to == "jsonl"


@pytest.mark.parametrize("value, error", [
    ("tensorbord", "log_to: 'tensorbord' is not one of jsonl, tensorboard, wandb"),
    (["wandb", "mlflow"], "log_to: 'mlflow' is not one of jsonl, tensorboard, wandb"),
])  # fmt: skip
def test_an_unknown_tracker_is_one_line_naming_the_choices(value, error):
    with pytest.raises(ConfigError) as info:
        merge({}, {"log_to": value})
    assert str(info.value) == error


@pytest.mark.parametrize("spec", ["5", "0:3", "5:3", "a:b", "3:", ":4", "-1:2"])
def test_a_bad_profile_window_names_the_field_and_what_is_valid(spec):
    with pytest.raises(ConfigError) as info:
        merge({"profile": spec}, {})
    assert str(info.value) == (
        f"profile: expected START:END, training steps with 1 <= START <= END (say 5:8), "
        f"got {spec!r}"
    )
    assert merge({"profile": "4:4"}, {}).profile == "4:4"


@pytest.mark.parametrize("tracker, module", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_a_missing_tracker_package_is_one_line_naming_the_extra(tmp_path, tracker, module):
    blocked = tmp_path / "blocked" / module  # an installed package that cannot be imported
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('not installed')\n")
    done = run(train_command(tmp_path / "out", "--log-to", tracker),
               env={"PYTHONPATH": str(tmp_path / "blocked")})  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: log_to: {tracker} needs the {module} package: pip install 'refddp[{module}]'"
    )


def test_a_records_numbers_reach_the_trackers_under_grouped_tags():
    record = {"epoch": 1, "step": 8, "train_loss": 0.5, "val_loss": 0.4, "val_acc": 0.9,
              "samples_per_s": 100.0, "peak_memory_mb": 12.0, "slowest_rank": 1,
              "straggler_lag_s": 0.002, "note": "text"}  # fmt: skip
    assert record_scalars(record) == {
        "train/epoch": 1.0, "train/mean_loss": 0.5, "val/loss": 0.4, "val/acc": 0.9,
        "perf/samples_per_s": 100.0, "memory/peak_mb": 12.0, "stragglers/slowest_rank": 1.0,
        "stragglers/lag_s": 0.002,
    }  # fmt: skip


UNUSED_RUN = Run("unused", {}, 0, resumed=False)  # what a tracker is told where it reads nothing


class Failing(Tracker):
    def log(self, step, scalars):
        raise OSError(28, f"No space left on device at step {step}")


def test_a_tracker_failing_between_evaluations_fails_at_the_next_record_not_alone():
    trackers = Trackers([Failing(UNUSED_RUN)])
    trackers.log(3, {"train/loss": 1.0})  # rank 0 alone: must not raise here
    trackers.log(4, {"train/loss": 1.0})
    trackers.flush()
    with pytest.raises(OSError, match="at step 3"):
        trackers.record({"step": 4})  # where every rank meets (rank0_then_meet)
    trackers.record({"step": 5})  # reported once


class Closing(Tracker):
    """Records how it closed in ``closed``; fails to flush or close when ``fails`` says so."""

    def __init__(self, name, closed, fails=""):
        super().__init__(UNUSED_RUN)
        self.name, self.closed, self.fails = name, closed, fails

    def _full_disk_at(self, call):
        if self.fails == call:
            raise OSError(28, "No space left on device")

    def flush(self):
        self._full_disk_at("flush")

    def close(self):
        self.closed.append(f"{self.name} closed")
        self._full_disk_at("close")

    def close_failed(self):
        self.closed.append(f"{self.name} closed as failed")
        self._full_disk_at("close_failed")


def test_a_failed_run_closes_every_tracker_as_failed_and_raises_none_of_theirs(caplog):
    closed = []
    trackers = Trackers([Closing("a", closed, fails="close_failed"), Closing("b", closed)])
    with caplog.at_level("WARNING", logger="refddp"):
        trackers.close_failed()  # the trainer then raises the run's own error
    assert closed == ["a closed as failed", "b closed as failed"]
    assert "log_to: a did not close after the failure: OSError(28, " in caplog.text
    trackers.close()  # nothing left open
    assert len(closed) == 2


def test_a_tracker_failing_as_the_run_ends_fails_it_and_the_others_close_as_failed():
    closed = []
    trackers = Trackers([Closing("a", closed), Closing("b", closed, fails="close"),
                         Closing("c", closed)])  # fmt: skip
    with pytest.raises(OSError):
        trackers.close()
    assert closed == ["a closed", "b closed", "c closed as failed"]
    # Every tracker flushes before any closes: a full disk shows there, and none closes as done.
    closed.clear()
    trackers = Trackers([Closing("a", closed), Closing("b", closed, fails="flush")])
    with pytest.raises(OSError):
        trackers.close()
    assert closed == ["a closed as failed", "b closed as failed"]
    # An error kept from log or flush fails the end too: every tracker closes as failed.
    closed.clear()
    kept = Trackers([Failing(UNUSED_RUN), Closing("d", closed)])
    kept.log(3, {"train/loss": 1.0})
    with pytest.raises(OSError, match="at step 3"):
        kept.close()
    assert closed == ["d closed as failed"]


def test_a_tracker_failing_to_open_closes_those_opened_as_failed(monkeypatch):
    closed = []

    def tracker_class(name):
        if name == "broken":
            def broken(run):
                raise OSError(13, "Permission denied")
            return broken
        return lambda run: Closing(name, closed)

    monkeypatch.setattr(trackers_module, "tracker_class", tracker_class)
    with pytest.raises(OSError, match="Permission denied"):
        Trackers.open(["first", "broken", "never"], UNUSED_RUN)
    assert closed == ["jsonl closed as failed", "first closed as failed"]


def fields(slowest, lag_share):
    return {"slowest_rank": slowest, "straggler_lag_s": 0.001, "straggler_lag_share": lag_share}


def test_the_straggler_warning_needs_the_same_rank_behind_at_consecutive_evaluations():
    watch = StragglerWatch()
    behind = fields(1, LAG_SHARE)
    said = [watch.observe(behind) for _ in range(PERSISTENT + 2)]
    assert [s is not None for s in said] == [False] * (PERSISTENT - 1) + [True, False, False]
    assert said[PERSISTENT - 1].startswith(f"rank 1 is the slowest at {PERSISTENT} evaluations")
    for interruption in (fields(0, 1.0), fields(1, LAG_SHARE / 2)):
        watch = StragglerWatch()  # a streak broken by another rank, or by a close race, restarts
        said = [watch.observe(f) for f in [behind] * (PERSISTENT - 1) + [interruption, behind]]
        assert said == [None] * (PERSISTENT + 1)


def test_the_slowest_rank_is_the_one_with_most_compute_and_data_wait_per_step():
    # the summed times vector: compute of ranks 0..3, then their data waits
    found = straggler_fields([0.010, 0.011, 0.009, 0.010, 0.000, 0.000, 0.006, 0.001])
    assert found["slowest_rank"] == 2
    assert found["straggler_lag_s"] == pytest.approx(0.015 - 0.011)
    assert found["straggler_lag_share"] == pytest.approx(0.004 / 0.011)
    assert straggler_fields([0.5, 0.1]) == {}, "one rank: nobody to lag behind"


def test_tensorboard_gets_each_logged_step_as_one_event_in_batches(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from refddp.training.trackers import tensorboard

    board = tensorboard.TensorBoard(Run(str(tmp_path), {}, 0, resumed=False))
    for step in range(1, tensorboard.PENDING):
        board.log(step, {"train/loss": 1.0 / step, "train/lr": 0.5})
    board.writer.flush()  # the writer's own flush: what it was given is on disk
    assert board_events(tmp_path) == [], "held until a batch is full"
    board.log(tensorboard.PENDING, {"train/loss": 0.25, "train/lr": 0.5})
    board.writer.flush()
    found = board_events(tmp_path)
    assert [(step, tags) for step, tags, _ in found] == [
        (step, ["train/loss", "train/lr"]) for step in range(1, tensorboard.PENDING + 1)
    ], "one event per logged step, with all its scalars"
    assert found[1][2] == {"train/loss": 0.5, "train/lr": 0.5}
    # A step logged PENDING_S after the last hand-over goes with what is held; its event
    # keeps the time it was logged at.
    clock = [board.handed_at + 1.0]
    monkeypatch.setattr(tensorboard.time, "time", lambda: clock[0])
    board.log(20, {"train/loss": 0.125})
    logged_at = clock[0]
    clock[0] = board.handed_at + tensorboard.PENDING_S
    board.log(21, {"train/loss": 0.0625})
    board.writer.flush()
    assert [step for step, _, _ in board_events(tmp_path)][-2:] == [20, 21]
    assert board_wall_times(tmp_path)[20] == logged_at
    # Steps logged that far apart go at once; a checkpoint's flush and the end take the rest.
    clock[0] += tensorboard.PENDING_S
    board.log(22, {"train/loss": 0.03125})
    board.writer.flush()
    assert board_events(tmp_path)[-1][0] == 22
    board.log(23, {"train/loss": 0.015625})
    board.flush()
    assert board_events(tmp_path)[-1][0] == 23
    board.log(24, {"train/loss": 0.0078125})
    board.close()
    assert board_events(tmp_path)[-1][0] == 24


def test_a_fresh_run_in_a_used_directory_has_only_its_own_history_and_curves(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from refddp.training.trackers.jsonl import History
    from refddp.training.trackers.tensorboard import TensorBoard

    def invocation(start_step: int, resumed: bool, losses: dict[int, float]) -> None:
        run_info = Run(str(tmp_path), {}, start_step, resumed=resumed)
        trackers = [History(run_info), TensorBoard(run_info)]
        for step, loss in losses.items():
            trackers[1].log(step, {"train/loss": loss})
        for tracker in trackers:
            tracker.record({"step": max(losses), "train_loss": losses[max(losses)]})
            tracker.close()

    invocation(0, False, {1: 4.0, 2: 3.0, 3: 2.0, 4: 1.0})  # an earlier run, to step 4
    invocation(0, False, {1: 0.5, 2: 0.25})  # --resume never: a new run, to step 2
    assert [(r["step"], r["train_loss"]) for r in history(tmp_path)] == [(2, 0.25)]
    board = tensorboard_scalars(tmp_path)
    assert board["train/loss"] == [(1, 0.5), (2, 0.25)], "the earlier run's points are hidden"
    invocation(2, True, {3: 0.125})  # resumed at step 2: its steps follow the run's own
    assert [r["step"] for r in history(tmp_path)] == [2, 3]
    assert tensorboard_scalars(tmp_path)["train/loss"] == [(1, 0.5), (2, 0.25), (3, 0.125)]


def test_a_slow_node_s_ranks_are_behind_together_and_named_with_their_node():
    # 2 nodes of 2 ranks; node 1's ranks take 1.15x: both are behind, measured against the
    # fast half (against a median halfway between, 1.07x, neither would be).
    found = straggler_fields([0.010, 0.010, 0.0115, 0.0116, 0.0, 0.0, 0.0, 0.0])
    assert found["behind_ranks"] == [2, 3] and found["slowest_rank"] == 3
    watch = StragglerWatch(ranks_per_node=2)
    said = [watch.observe(found) for _ in range(PERSISTENT)]
    assert said[-1].startswith(f"ranks [2, 3] (node 1) are the slowest at {PERSISTENT} "
                               "evaluations in a row")  # fmt: skip
    one = straggler_fields([0.010, 0.010, 0.010, 0.017, 0.0, 0.0, 0.0, 0.0])
    assert one["behind_ranks"] == [3], "one slow rank of a node is a rank, not a node"
    assert whose([3], 2) == "rank 3" and whose([1, 2], 2) == "ranks [1, 2]"
    assert whose([2, 3, 4, 5], 2) == "ranks [2, 3, 4, 5] (nodes 1, 2)"
    assert whose([2, 3], 0) == "ranks [2, 3]", "one node: no node to name"


def test_a_slow_node_stays_named_while_its_very_slowest_rank_changes():
    two_first = straggler_fields([0.010, 0.010, 0.0117, 0.0116, 0.0, 0.0, 0.0, 0.0])
    three_first = straggler_fields([0.010, 0.010, 0.0115, 0.0116, 0.0, 0.0, 0.0, 0.0])
    assert (two_first["slowest_rank"], three_first["slowest_rank"]) == (2, 3)
    watch = StragglerWatch(ranks_per_node=2)
    said = [watch.observe(f) for f in (two_first, three_first, two_first)]
    assert said[-1] is not None and said[-1].startswith("ranks [2, 3] (node 1) are the slowest")


def test_the_ranks_behind_agree_with_the_slowest_rank_s_lag_share():
    odd = straggler_fields([1.0, 1.2, 1.3, 0.0, 0.0, 0.0])  # 18% over the others' median
    assert odd["straggler_lag_share"] > LAG_SHARE and odd["behind_ranks"] == [2]
    idle = straggler_fields([0.0, 0.0, 0.0, 0.001, 0.0, 0.0, 0.0, 0.0])
    assert idle["straggler_lag_share"] == 0.0 and idle["behind_ranks"] == []


def test_nodes_are_named_only_on_torchrun_jobs_of_several_equal_nodes(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert ranks_per_node(4) == 2
    assert ranks_per_node(5) == 0, "nodes of different sizes"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert ranks_per_node(2) == 0, "one node"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "two")
    assert ranks_per_node(4) == 0
    monkeypatch.delenv("GROUP_WORLD_SIZE")
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert ranks_per_node(4) == 0, "srun sets neither"
