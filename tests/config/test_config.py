"""One flat config: every field a YAML key and a CLI flag, validated with one-line errors."""

import dataclasses

import pytest
import torch

from refddp.config.command_line import build_parser, load_yaml, merge, parse_cli
from refddp.config.schema import FIELDS, ConfigError, TrainConfig
from refddp.config.validation import per_rank_batch_size


def resolve(argv, yaml_values=None, checkpoint=None):
    cli, _ = parse_cli(argv)
    return merge(cli, yaml_values or {}, checkpoint)


def test_every_field_is_a_cli_flag_with_its_help():
    help_text = build_parser().format_help()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in help_text, flag
    assert "--no-progress" in help_text and "--log-all-ranks" in help_text


def test_cli_beats_yaml_beats_checkpoint_beats_default():
    c = resolve(
        ["--lr", "0.5"],
        yaml_values={"lr": 0.25, "batch_size": 7},
        checkpoint={"lr": 0.125, "batch_size": 5, "epochs": 9},
    )
    assert (c.lr, c.batch_size, c.epochs, c.seed) == (0.5, 7, 9, TrainConfig().seed)


def test_checkpoint_never_sets_invocation_fields():
    c = resolve([], checkpoint={"task": "eval", "out": "elsewhere", "nproc": 4, "resume": "x.pt"})
    assert (c.task, c.out, c.nproc, c.resume) == ("train", "runs/default", 0, "auto")


def test_yaml_file_loads_and_typo_is_named_with_a_suggestion(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("lr: 0.01\namp: bf16\nprogress: false\n")
    assert load_yaml(str(good)) == {"lr": 0.01, "amp": "bf16", "progress": False}
    typo = tmp_path / "typo.yaml"
    typo.write_text("lerning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'lerning_rate'"):
        load_yaml(str(typo))
    near = tmp_path / "near.yaml"
    near.write_text("batchsize: 3\n")
    with pytest.raises(ConfigError, match=r"did you mean batch_size\?"):
        load_yaml(str(near))


def test_yaml_values_are_type_checked(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: three\n")
    with pytest.raises(ConfigError, match=r"^epochs: expected int, got 'three'$"):
        load_yaml(str(bad))
    huge = tmp_path / "huge.yaml"
    huge.write_text(f"lr: 1{'0' * 400}\n")  # an int too large for a float: not an OverflowError
    with pytest.raises(ConfigError, match=r"^lr: expected a finite number, got inf$"):
        load_yaml(str(huge))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch-size", "0"], r"^batch_size: must be >= 1, got 0$"),
        (["--lr", "-1"], r"^lr: must be > 0, got -1.0$"),
        (["--amp", "fp8"], r"--amp: invalid choice: 'fp8'"),
        (["--epochs", "two"], r"--epochs: invalid int value: 'two'"),
        (["--bogus"], r"unrecognized arguments: --bogus"),
        (["--amp", "fp16", "--dtype", "float64"], r"^amp: fp16 needs dtype float32"),
        (["--resume", "weights.bin"], r"^resume: expected auto, never, a .pt/.pth file or a .dcp"),
        (["--ckpt-format", "zarr"], r"--ckpt-format: invalid choice: .zarr."),
        (["--timeout", "0"], r"^timeout: must be > 0"),
        (["--timeout", "1e12"], r"^timeout: must be at most 604800 seconds \(a week\), got 1000000000000.0$"),
        (["--num-classes", "1"], r"^num_classes: must be >= 2"),
        (["--on-nonfinite", "ignore"], r"--on-nonfinite: invalid choice: .ignore."),
    ],
)
def test_invalid_values_are_one_line_errors_naming_the_field(argv, message):
    with pytest.raises(ConfigError, match=message) as info:
        resolve(argv)
    assert "\n" not in str(info.value)


FLOAT_FIELDS = [name for name, f in FIELDS.items() if str(f.type) == "float"]
assert len(FLOAT_FIELDS) >= 9  # (the schema's float fields, found by their type)


@pytest.mark.parametrize("source", ["cli", "yaml", "checkpoint"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_no_float_setting_takes_a_value_that_is_not_finite(tmp_path, name, value, source):
    """NaN and infinity pass a bound written as ``value < low`` and reach the run: an infinite
    --stop-check-s ended a 2-rank run in an OverflowError after it started, a NaN --grad-clip
    clipped every gradient to NaN. Refused from every source, with one line naming the field."""
    config = tmp_path / "c.yaml"
    config.write_text(f"{name}: {value.replace('nan', '.nan').replace('inf', '.inf')}\n")
    expected = f"{name}: expected a finite number, got {value.replace('-', '[-]')}"
    if source == "checkpoint":
        expected = rf"checkpoint: {expected} \(pass --{name.replace('_', '-')} to replace it\)"
    expected = f"^{expected}$"
    with pytest.raises(ConfigError, match=expected):
        if source == "cli":
            resolve([f"--{name.replace('_', '-')}={value}"])
        elif source == "yaml":
            resolve([], load_yaml(str(config)))
        else:
            resolve([], checkpoint={name: float(value)})
    good = 0.5 if name in ("dropout", "augment", "momentum") else 1.0
    # A checkpoint saved before the check took such a value: resumed with the user's in its place.
    assert getattr(resolve([f"--{name.replace('_', '-')}={good}"],
                           checkpoint={name: float(value)}), name) == good  # fmt: skip


def test_global_batch_size_sets_the_per_rank_batch_and_must_divide():
    c = resolve(["--global-batch-size", "64", "--grad-accum", "2"])
    assert per_rank_batch_size(c, world_size=4) == 8
    with pytest.raises(ConfigError, match=r"global_batch_size: 64 does not divide by world size 3"):
        per_rank_batch_size(c, world_size=3)


def test_bool_flags_have_negations():
    assert resolve(["--no-progress"]).progress is False
    assert resolve(["--deterministic"]).deterministic is True


def test_fields_table_matches_the_dataclass():
    assert list(FIELDS) == [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize(
    ("flags", "device", "fused"),
    [
        ({}, "cuda", True),  # one kernel a step
        ({"optimizer": "sgd"}, "cuda", True),
        ({"strategy": "fsdp"}, "cuda", True),
        ({"strategy": "fsdp", "optimizer": "sgd"}, "cuda", False),  # no sharded fused SGD
        ({"optimizer": "sgd", "amp": "fp16"}, "cuda", False),  # a skip leaves momentum unset
        ({"amp": "fp16"}, "cuda", True),  # AdamW's state starts at zero, its skip rolls back
        ({}, "cpu", False),  # torch's default kernels
    ],
)
def test_the_optimizer_is_fused_on_cuda_where_torch_has_the_kernel(flags, device, fused):
    from refddp.training.run_setup import fuses_on_cuda

    assert fuses_on_cuda(TrainConfig(**flags), torch.device(device)) is fused
