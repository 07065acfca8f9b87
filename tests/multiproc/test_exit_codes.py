"""Exit codes and one-line errors of the real CLI for failures that happen after ranks start."""





def error_lines(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


def test_a_sigkilled_rank_is_named_and_no_empty_stack_file_is_reported(run_cli, tiny):
    done = run_cli(
        "--nproc", 2, model="tests.user_code:killed_mlp", check=False,
        env={"REFDDP_TEST_KILL_AT": "3"}, **tiny,
    )  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "rank 1 killed by SIGKILL" in last
    assert "stacks of hung ranks" not in last, "a killed rank leaves only an empty stack file"
    assert last.endswith("see the ranks' output above")


def test_a_config_error_on_one_rank_only_is_printed_naming_the_rank(run_cli, tiny):
    done = run_cli(
        "--nproc", 2, data="tests.user_code:datasets_missing_on_rank_1", check=False, **tiny
    )
    assert done.returncode == 2, done.stderr
    assert error_lines(done.stderr) == [
        "error: data: file not found: /node-local/train.pt (rank 1)"
    ], done.stderr
