"""The curated mutants: each removes one mechanism behind one README guarantee.

A mutant names the file, an exact snippet that must occur exactly once, its replacement, and
the few tests that must fail without the mechanism (the fastest first: the runner stops at
the first failure). ``equivalent`` documents a mutant no test can kill, and why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    equivalent: str = ""
    needs: str = ""  # a module its tests need (they skip without it): judged only where it imports


DATA, TRAINER, EVALUATION = "refddp/workload/data.py", "refddp/training/trainer.py", "refddp/training/evaluation.py"
STEPS, RUN_SETUP = "refddp/training/steps.py", "refddp/training/run_setup.py"
CKPT, COLLECTIVES = "refddp/checkpoints/loading.py", "refddp/testing/checks/collectives.py"
SIGNATURES, CHECK = "refddp/testing/checks/signatures.py", "refddp/testing/checks/fingerprint.py"
BOARD, T_BOARD = "refddp/testing/checks/board.py", "tests/harness/test_board.py"
GROUP_METHODS = "refddp/testing/checks/process_groups.py"
T_SIGNATURES = "tests/harness/test_signatures.py"
T_FINGERPRINT = "tests/harness/test_collective_fingerprint.py"
T_METHODS = "tests/harness/test_process_group_methods.py"
T_RECORDED_ONCE = (f"{T_METHODS}::test_each_collective_is_recorded_once_whether_called_as_a_"
                   "function_or_a_method")
RUN_STATE, RUN_FILES = "refddp/checkpoints/run_state.py", "refddp/checkpoints/run_files.py"
CKPT_FULL = "refddp/checkpoints/full.py"
SYNC_BN, PARALLEL = "refddp/training/sync_batchnorm.py", "refddp/training/parallel.py"
T_PARALLEL, T_FSDP = "tests/training/test_parallel.py", "tests/training/test_fsdp.py"
T_DATA = "tests/workload/test_data.py"
CKPT_DCP, T_DCP = "refddp/checkpoints/dcp.py", "tests/checkpoints/test_checkpoint_dcp.py"
T_CONVERT = "tests/checkpoints/test_convert_checkpoint.py"
T_CLI = "tests/commands/test_cli.py"
T_TRAINER = "tests/training/test_trainer_guarantees.py"
T_MODELS = "tests/training/test_realistic_models.py"
T_DDP = "tests/training/test_ddp_equivalence.py"
T_HARNESS = "tests/harness/test_harness.py"
DIST, T_WATCHDOG = "refddp/launch/dist.py", "tests/training/test_watchdog.py"
WATCHDOG = "refddp/training/watchdog.py"
AGREEMENT, T_NONFINITE = "refddp/training/step_agreement.py", "tests/training/test_nonfinite_steps.py"
T_SCENARIOS = "tests/training/test_step_scenarios.py"
T_KERNELS = "tests/training/test_optimizer_kernels.py"
WINDOW, T_SEQ = "refddp/training/window.py", "tests/workload/test_sequence_workloads.py"
T_HF, T_CHECKS = "tests/workload/test_hf_model.py", "tests/workload/test_objective_checks.py"
SLURM, T_SLURM_ENV = "refddp/launch/slurm.py", "tests/launch/test_slurm_environment.py"
T_SLURM_TASKS = "tests/launch/test_slurm_tasks.py"
EXPORT, T_EXPORT = "refddp/export.py", "tests/commands/test_export.py"
FAULTS, T_FAULTS = "refddp/testing/faults.py", "tests/harness/test_harness_faults.py"
NODES, T_NODES = "refddp/testing/nodes/simulated.py", "tests/harness/test_harness_nodes.py"
REPORTS, POOL = "refddp/testing/driver/reports.py", "refddp/testing/driver/pool.py"
TASKS = "refddp/testing/driver/tasks.py"
T_SKIPPED = "tests/harness/test_skipped_collectives.py"
T_SKIP_BLAME = "tests/harness/test_skip_blame.py"
CLUSTER, T_CLUSTER = "refddp/testing/cluster.py", "tests/harness/test_cluster.py"
NAMESPACES = "refddp/testing/nodes/namespaces.py"
NETWORK, T_NETWORK = "refddp/launch/network_checks.py", "tests/commands/test_doctor_network.py"
RANK_LISTS, T_RANK_LISTS = "refddp/testing/rank_lists.py", "tests/harness/test_rank_lists.py"
T_SCALE, T_SERVER = "tests/training/test_scale.py", "tests/harness/test_rank_server.py"
WORKER, SERVER = "refddp/testing/rank/worker.py", "refddp/testing/driver/rank_server.py"
PARITY, T_PARITY = "refddp/testing/rank/parity.py", "tests/harness/test_harness_parity.py"
T_REAL = "tests/harness/test_harness_real_nodes.py"
T_UNPRIVILEGED = "tests/harness/test_cluster_unprivileged.py::test_the_cluster_tests_pass_for_a_user_without_root"
T_FIRES = f"{T_FAULTS}::test_a_fault_fires_inside_collective_k_after_every_rank_finished_those_before"
TENSORBOARD, T_TRACKERS = "refddp/training/trackers/tensorboard.py", "tests/training/test_trackers.py"
STRAGGLERS, T_STRAGGLERS = "refddp/training/stragglers.py", "tests/training/test_stragglers.py"
PROFILER, T_PROFILER = "refddp/training/profiler.py", "tests/training/test_profiler.py"
T_TRACKER_UNITS = "tests/training/test_watching_a_run.py"
T_FAILED_RUN = ("tests/training/test_trackers.py::test_a_failed_run_closes_its_trackers_with_every_point"
                "_and_w_and_b_marks_it_failed")
SCHEDULE, T_SCHEDULE = "refddp/training/schedule.py", "tests/training/test_schedule.py"
BATCHES = "refddp/workload/objectives/batches.py"
IMAGE_FOLDER = "refddp/workload/image_folder.py"
SKIPPED, T_SKIPPED_STEPS = "refddp/training/skips.py", "tests/training/test_skipped_steps.py"
PROTOCOL, T_STACKS = "refddp/testing/protocol.py", "tests/harness/test_hang_stacks.py"
UNITTEST = "refddp/testing/driver/unittest_case.py"

LINT_RULES, LINT_IR = "refddp/lint/rules.py", "refddp/lint/ir.py"
LINT_VALUES, LINT_FLOW = "refddp/lint/rank_values.py", "refddp/lint/dataflow.py"
T_LINT = "tests/lint/test_lint_cases.py::test_the_lint_reports_exactly_the_planted_lines"
T_LINT_PROPS = ("tests/lint/test_lint_properties.py::"
                "test_the_lint_flags_a_collective_iff_the_ranks_can_disagree")
T_LINT_TURNS = ("tests/lint/test_lint_properties.py::"
                "test_two_turns_pass_iff_they_complement_each_other_around_quiet_code")
T_LINT_CMD, T_LINT_SELF = "tests/lint/test_lint_commands.py", "tests/project/test_no_collective_under_rank_branch.py"


def lint_case(name: str) -> str:
    return f"{T_LINT}[{name}]"



# The collective check over the space of calls (issue 48), and group methods traced.
CHECK_SPACE = "the collective check over the space of calls"
SAME_RANKS = "two groups over the same ranks, and a send and its receive of another tag or group"
T_SAME_RANKS = (f"{T_FINGERPRINT}::test_two_groups_over_the_same_ranks_are_told_apart_by_their_"
                "names_in_seconds")
T_SPACE = "tests/harness/test_collective_space.py"
GROUPS_TRACED = "collectives called on a process-group object are traced"
T_EXPLICIT_START = ("tests/workload/test_worker_start.py::test_a_dataset_that_does_not_pickle_under_an_explicit"
                    "_start_is_one_line_naming_the_option")
T_FRESH_RUN = ("tests/checkpoints/test_resume.py::test_a_fresh_run_in_a_used_directory_leaves_none_of_the"
               "_earlier_runs_checkpoints")
T_LOWERED_END = ("tests/checkpoints/test_resume.py::test_a_resume_at_a_lowered_end_evaluates_there_and_one"
                 "_below_the_step_is_refused")
ISSUE_48 = [
    Mutant(
        "left-out-root-unlike-rank-0", CHECK_SPACE, COLLECTIVES,
        "        call[plain] = 0  # what torch takes for a root left out", "        pass",
        (f"{T_SPACE}::test_a_root_left_out_is_global_rank_0_and_a_rank_outside_a_group_is_left_alone",),
    ),
    Mutant(
        "root-lists-recorded", CHECK_SPACE, COLLECTIVES,
        "        alike = signatures.describe(name, call, alike=True)",
        "        alike = signatures.describe(name, call)",
        ("tests/training/test_step_scenarios.py::test_every_generated_scenario_keeps_the_ranks_in_step_and_leaves_skips_no_trace",),
    ),
    Mutant(
        "rank-outside-the-group-checked", CHECK_SPACE, COLLECTIVES,
        "        if _outside(call):  # no collective at all", "        if False:",
        (f"{T_SPACE}::test_a_root_left_out_is_global_rank_0_and_a_rank_outside_a_group_is_left_alone",),
    ),
    Mutant(
        "list-entries-compared-without-dtypes", CHECK_SPACE, SIGNATURES,
        '        return shape_text(value) or f"[{len(value)}]"',
        '        return str([tuple(t.shape) for t in value])',
        (f"{T_SIGNATURES}::test_all_gather_compares_the_list_with_its_dtypes_and_the_own_part_by_"
         "dtype_only",),
    ),
    Mutant(
        "own-part-dtype-uncompared", CHECK_SPACE, SIGNATURES,
        '    "all_gather": {"tensor_list": LIST, "tensor": DTYPE},',
        '    "all_gather": {"tensor_list": LIST},',
        (f"{T_SIGNATURES}::test_all_gather_compares_the_list_with_its_dtypes_and_the_own_part_by_"
         "dtype_only",
         f"{T_FINGERPRINT}::test_a_ranks_own_part_in_another_dtype_is_a_mismatch_on_every_rank"),
    ),
    Mutant(
        "broadcast-shapes-compared", CHECK_SPACE, SIGNATURES,
        '    "broadcast": {"tensor": ELEMENTS},', '    "broadcast": {"tensor": SHAPE},',
        (f"{T_SIGNATURES}::test_broadcast_compares_element_counts_not_shapes",
         f"{T_FINGERPRINT}::test_a_broadcast_of_the_same_element_count_in_another_shape_passes"),
    ),
    Mutant(
        "whole-tensors-form-compared", CHECK_SPACE, SIGNATURES,
        '    "all_gather_into_tensor": {"output_tensor": ELEMENTS, "input_tensor": SHAPE},',
        '    "all_gather_into_tensor": {"output_tensor": SHAPE, "input_tensor": SHAPE},',
        (f"{T_SIGNATURES}::test_single_tensor_forms_let_each_rank_concatenate_or_stack_its_whole_"
         "tensor",),
    ),
    Mutant(
        "object-list-length-uncompared", CHECK_SPACE, SIGNATURES,
        '    "broadcast_object_list": {"object_list": LENGTH},', '    "broadcast_object_list": {},',
        (f"{T_SIGNATURES}::test_object_collectives_compare_list_lengths_and_roots_not_objects",),
    ),
    Mutant(
        "split-sizes-paired-with-their-own", CHECK_SPACE, SIGNATURES,
        "        if sends[i][j] != recvs[j][i]", "        if sends[i][j] != recvs[i][j]",
        (f"{T_SIGNATURES}::test_all_to_all_split_sizes_are_paired_across_ranks_not_compared",),
    ),
    Mutant(
        "split-sizes-unpaired-on-the-world", CHECK_SPACE, CHECK,
        "    if pairs is not None and world_size <= PAIRING_LIMIT:", "    if False:",
        (f"{T_FINGERPRINT}::test_all_to_all_split_sizes_that_do_not_pair_up_fail_naming_the_pair",),
    ),
    Mutant(
        "split-sizes-unpaired-on-subgroups", CHECK_SPACE, CHECK,
        "    if records[0][3] is not None:", "    if False:",
        (f"{T_SIGNATURES}::test_a_subgroups_verdict_names_each_member_and_what_differs",),
    ),
    Mutant(
        "subgroups-left-unchecked", CHECK_SPACE, CHECK,
        "    elif _store is not None:\n", "    elif False:\n",
        (f"{T_FINGERPRINT}::test_a_subgroups_members_that_disagree_fail_and_the_others_finish",),
    ),
    Mutant(
        "rank-on-another-group-unseen", CHECK_SPACE, CHECK,
        "    if not needs_me or same_group:",
        "    if True:",
        (f"{T_FINGERPRINT}::test_a_rank_on_a_subgroup_while_its_peers_are_on_the_world_is_named_in_"
         "seconds",),
    ),
    Mutant(
        "receive-left-unchecked", CHECK_SPACE, CHECK,
        "        if sent != signatures.payload(self.call):", "        if False:",
        (f"{T_FINGERPRINT}::test_a_receive_of_another_dtype_than_its_send_fails_naming_both",),
    ),
    Mutant(
        "group-names-uncompared", SAME_RANKS, COLLECTIVES,
        '    named = signatures.group_name(call.get("group"))', '    named = ""',
        (f"{T_SAME_RANKS}[groups-of-every-rank]",),
    ),
    Mutant(
        "same-ranks-subgroups-taken-for-one", SAME_RANKS, CHECK,
        "        same_group = slot.group == named", "        same_group = True",
        (f"{T_SAME_RANKS}[subgroups]",),
    ),
    Mutant(
        "groups-over-the-same-ranks-unnamed", SAME_RANKS, CHECK,
        "    if alike or pair:", "    if False:",
        (f"{T_SAME_RANKS}[groups-of-every-rank]",),
    ),
    Mutant(
        "peer-finishing-a-call-taken-for-a-hang", SAME_RANKS, CHECK,
        "    if slot.position and _entered.get(slot.sequence, 0) >= slot.position:",
        "    if False:",
        (f"{T_FINGERPRINT}::test_a_receive_whose_sender_is_still_finishing_a_collective_it_"
         "left_passes",),
    ),
    Mutant(
        "slow-send-to-an-irecv-taken-for-a-hang", SAME_RANKS, CHECK,
        "    if not slot.position and unwaited_with(member):", "    if False:",
        (f"{T_FINGERPRINT}::test_a_slow_send_that_an_irecv_in_flight_takes_passes",),
    ),
    Mutant(
        "async-collective-taken-for-a-receive-s-answer", SAME_RANKS, COLLECTIVES,
        "    return any(members == \"?\" or peer in members.split(\",\")\n"
        "               for work, (members, _, point_to_point) in list(_in_flight.items())\n"
        "               if point_to_point and",
        "    return any(members in (\"*\", \"?\") or peer in members.split(\",\")\n"
        "               for work, (members, _, point_to_point) in list(_in_flight.items())\n"
        "               if",
        (f"{T_FINGERPRINT}::test_a_receive_whose_sender_cannot_post_is_named_in_seconds",),
    ),
    Mutant(
        "any-source-irecv-answers-nobody", SAME_RANKS, COLLECTIVES,
        "    return any(members == \"?\" or peer in members.split(\",\")\n",
        "    return any(peer in members.split(\",\")\n",
        (f"{T_FINGERPRINT}::test_a_slow_send_that_an_irecv_in_flight_takes_passes",),
    ),
    Mutant(
        "ranks-waiting-on-one-another-unnamed", SAME_RANKS, "refddp/testing/driver/tasks.py",
        "                        if absent else waiting_on_one_another_headline(one_sided, slots, "
        "certain))",
        "                        )",
        (f"{T_FINGERPRINT}::test_ranks_waiting_for_good_on_one_another_are_named_with_their_"
         "groups_unchecked",),
    ),
    Mutant(
        "receive-waits-blind", SAME_RANKS, CHECK,
        "        _wait_for([self.key], [self.sender], self.display, self.count, named)",
        "        _store.wait([self.key])",
        (f"{T_FINGERPRINT}::test_a_receive_whose_sender_cannot_post_is_named_in_seconds"
         "[a-send-of-another-tag]",),
    ),
    Mutant(
        "point-to-point-tags-undescribed", SAME_RANKS, SIGNATURES,
        "    tag = [f\"tag={int(call['tag'])}\"] if call.get(\"tag\") else []  # a send's or receive's",
        "    tag = []",
        (f"{T_FINGERPRINT}::test_a_receive_whose_sender_cannot_post_is_named_in_seconds"
         "[a-send-of-another-tag]",),
    ),
    Mutant(
        "full-size-backend-group-unchecked", CHECK_SPACE, CHECK,
        "        return (None, group.rank()) if group.size() == world_size else None",
        "        return None",
        (f"{T_METHODS}::test_a_group_built_from_the_backend_class_with_every_rank_is_checked",),
    ),
    Mutant(
        "torchs-group-wrapper-kept", CHECK_SPACE, CHECK,
        "        c10d._create_process_group_wrapper = lambda wrapped_pg, *args, **kwargs: wrapped_pg",
        "        pass",
        (f"{T_FINGERPRINT}::test_ddp_on_a_group_the_test_makes_runs_checked_by_the_harness_not_"
         "torchs_wrapper",),
    ),
    Mutant(
        "group-methods-untraced", GROUPS_TRACED, COLLECTIVES,
        "    process_groups.trace(_enter, _nested)\n", "",
        (T_RECORDED_ONCE,),
    ),
    Mutant(
        "group-methods-traced-inside-functions", GROUPS_TRACED, GROUP_METHODS,
        "        if nested():\n", "        if False:\n",
        (T_RECORDED_ONCE,),
    ),
    Mutant(
        "traced-isend-refused-by-p2pop", GROUPS_TRACED, COLLECTIVES,
        "        return other is self or other is self.__wrapped__", "        return other is self",
        (T_RECORDED_ONCE,),
    ),
    Mutant(
        "batch-ops-keep-the-traced-functions", GROUPS_TRACED, COLLECTIVES,
        '            return _enter(name, call, lambda: fn(_with_torchs_own_ops(call["p2p_op_list"])))',
        "            return _enter(name, call, lambda: fn(*args, **kwargs))",
        (T_RECORDED_ONCE,),
    ),
    Mutant(
        "group-roots-left-as-group-ranks", GROUPS_TRACED, SIGNATURES,
        "        return plain, int(dist.get_global_rank(group, int(call[in_group])))",
        "        return in_group, int(call[in_group])",
        (f"{T_METHODS}::test_a_groups_root_is_read_as_a_global_rank_on_a_subgroup",),
    ),
    Mutant(
        "group-method-waits-untraced", GROUPS_TRACED, GROUP_METHODS,
        '        call["group"], call["async_op"] = pg, True  # (every method returns a Work)',
        '        call["group"] = pg',
        (f"{T_METHODS}::test_a_rank_skipping_a_groups_broadcast_is_named_in_seconds[unchecked]",),
    ),
]

MUTANTS = (
    Mutant(
        "sampler-ignores-epoch", "per-epoch reshuffle", DATA,
        "manual_seed(self.seed + self.epoch)", "manual_seed(self.seed)",
        (f"{T_DATA}::test_global_batch_sampler_reshuffles_every_epoch",),
    ),
    Mutant(
        "trainer-never-sets-epoch", "per-epoch reshuffle", TRAINER,
        "self.sampler.set_epoch(self.epoch)", "self.sampler.set_epoch(0)",
        (f"{T_CLI}::test_ranks_see_disjoint_shards_that_cover_the_data_reshuffled_each_epoch",),
    ),
    Mutant(
        "every-rank-same-shard", "disjoint covering shards", DATA,
        "usable[self.rank :: self.num_replicas]",
        "usable[: len(usable) // self.num_replicas]",
        (f"{T_DATA}::test_global_batches_are_the_same_for_every_split",
         f"{T_CLI}::test_ranks_see_disjoint_shards_that_cover_the_data_reshuffled_each_epoch"),
    ),
    Mutant(
        "no-tail-drop", "disjoint covering shards, same steps on every rank", DATA,
        "order[self.start : self.steps_per_epoch * self.global_batch]", "order[self.start :]",
        (f"{T_DATA}::test_global_batches_are_the_same_for_every_split",),
    ),
    Mutant(
        "eval-padded-like-distributed-sampler", "exact unpadded eval", DATA,
        "self.indices = range(rank, length, world_size)",
        "self.indices = [i % max(length, 1) for i in range(rank, length + (-length) % "
        "world_size, world_size)]",
        (f"{T_TRAINER}::test_eval_counts_every_sample_once_at_any_world_size",),
    ),
    Mutant(
        "eval-not-all-reduced", "exact unpadded eval", EVALUATION,
        "    dist.all_reduce(sums)", "    pass",
        (f"{T_TRAINER}::test_eval_counts_every_sample_once_at_any_world_size",),
    ),
    Mutant(
        "reused-loader-keeps-epoch-0-sample-seeds", "exact resume (one loader for the run)",
        TRAINER, "            self.loader.dataset.epoch = self.epoch  # the samples' seeds (SeededFetch)\n",
        "",
        (f"{T_MODELS}::test_resume_mid_epoch_with_dropout_batchnorm_and_worker_augmentation_is"
         "_bit_identical",),
    ),
    Mutant(
        "reused-loader-keeps-its-worker-seeds", "exact resume (one loader for the run)", TRAINER,
        "            self.loader.generator.manual_seed(loader_seed)  # the workers' seeds\n", "",
        (f"{T_MODELS}::test_resume_at_an_epoch_boundary_repeats_augmentation_drawn_from_the"
         "_workers_seeds",),
    ),
    Mutant(
        "no-buffer-sync-before-eval", "buffer sync before eval", TRAINER,
        "        if self.model_has_buffers:\n            sync_buffers(self.model)\n"
        "        metrics = evaluate(",
        "        metrics = evaluate(",
        (f"{T_MODELS}::test_a_batchnorm_checkpoint_evaluates_in_a_plain_loop_to_its_recorded"
         "_metric",),
    ),
    Mutant(
        "no-buffer-sync-before-save", "buffer sync before save", TRAINER,
        "        if self.model_has_buffers:\n            sync_buffers(self.model)\n"
        "        per_rank",
        "        per_rank",
        (f"{T_TRAINER}::test_after_fit_every_rank_holds_the_saved_parameters_and_buffers",),
    ),
    Mutant(
        "rng-not-restored", "RNG restore (dropout)", RUN_STATE,
        "        set_rng_state(rng[rank])", "        pass",
        (f"{T_MODELS}::test_resume_mid_epoch_with_dropout_batchnorm_and_worker_augmentation_is"
         "_bit_identical",),
    ),
    Mutant(
        "augmentation-from-worker-streams", "worker-seed restore (augmentation in workers)", DATA,
        "torch.default_generator.manual_seed(sample_seed(self.seed, self.epoch, i))", "pass",
        (f"{T_DATA}::test_augmentation_depends_only_on_seed_epoch_and_sample",
         f"{T_MODELS}::test_resume_mid_epoch_with_dropout_batchnorm_and_worker_augmentation_is"
         "_bit_identical"),
    ),
    Mutant(
        "augmentation-seed-ignores-epoch", "fresh augmentation each epoch", DATA,
        "((seed * 1_000_003 + epoch) * 2_147_483_659 + index)",
        "(seed * 2_147_483_659 + index)",
        (f"{T_DATA}::test_augmentation_depends_only_on_seed_epoch_and_sample",),
    ),
    Mutant(
        "resume-from-epoch-start", "sampler position", TRAINER,
        "self.sampler.set_start(pos.step % self.sampler.steps_per_epoch * self.global_batch)",
        "self.sampler.set_start(0)",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical",),
    ),
    Mutant(
        "optimizer-not-restored", "optimizer restore", PARALLEL,
        "        if optimizer is not None and optimizer_state is not None:\n"
        "            optimizer.load_state_dict(optimizer_state)",
        "        if optimizer is not None and optimizer_state is not None:\n            pass",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical",),
    ),
    Mutant(
        "schedule-restarts-on-resume", "a resumed run's learning rate is its update's", RUN_STATE,
        "    parts.schedule.reset(updates)", "    parts.schedule.reset(0)",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical",),
    ),
    Mutant(
        "resume-keeps-the-saved-lr", "a learning rate changed on resume is applied", RUN_STATE,
        "    parts.schedule.reset(updates)", "    pass",
        ("tests/checkpoints/test_resume.py::test_lr_and_weight_decay_changed_on_resume_are_applied"
         "_and_recorded",),
    ),
    Mutant(
        "lr-never-advances", "the learning-rate schedule", SCHEDULE,
        "            )\n        self.scheduler.step()", "            )",
        (f"{T_SCHEDULE}::test_the_schedule_sets_what_lambda_lr_would_at_every_step_and_saves_its"
         "_state[cosine]",),
    ),
    Mutant(
        "schedule-restarts-at-step-0", "the learning-rate schedule after a resume", SCHEDULE,
        "last_epoch=updates - 1)", "last_epoch=-1)",
        (f"{T_SCHEDULE}::test_a_resumed_schedule_takes_its_rate_from_the_step_and_this_invocations_lr",),
    ),
    Mutant(
        "batch-left-off-the-device", "a batch reaches the model's device whole", BATCHES,
        "return batch if batch.device == device else batch.to(device, non_blocking=True)",
        "return batch",
        ("tests/workload/test_objectives.py::test_nested_batches_move_to_the_device_whole",),
    ),
    Mutant(
        "scaler-not-restored", "scaler restore", RUN_STATE,
        'parts.scaler.load_state_dict(state["scaler_state_dict"])', "pass",
        (f"{T_TRAINER}::test_fp16_scaler_state_survives_checkpoint_and_resume",),
    ),
    Mutant(
        "no-dataset-size-check", "ranks with different data fail clearly", TRAINER,
        "dist.all_reduce(extremes, op=dist.ReduceOp.MAX)", "pass",
        (f"{T_TRAINER}::test_ranks_with_different_dataset_sizes_fail_clearly_not_hang",),
    ),
    Mutant(
        "ddp-prefixed-keys", "clean checkpoint keys", PARALLEL,
        "        return self.model.state_dict()", "        return self.wrapped.state_dict()",
        (f"{T_TRAINER}::test_ddp_checkpoint_loads_strictly_into_a_plain_model_with_identical"
         "_outputs",),
    ),
    Mutant(
        "checkpoint-keeps-gpu-tensors", "a GPU run's checkpoint opens on a machine without it",
        CKPT_FULL, "    save_atomic(on_cpu(state), latest)", "    save_atomic(state, latest)",
        ("tests/checkpoints/test_checkpoint.py::test_the_written_checkpoint_holds_only_cpu_tensors_ties_kept",),
    ),
    Mutant(
        "tied-weights-saved-twice", "a GPU run's checkpoint keeps tied weights one tensor",
        CKPT_FULL, "        if key not in copies:\n", "        if True:\n",
        ("tests/checkpoints/test_checkpoint.py::test_the_written_checkpoint_holds_only_cpu_tensors_ties_kept",),
    ),
    Mutant(
        "write-in-place", "atomic checkpoint writes", RUN_FILES,
        'tmp = os.path.join(directory, temp_name("." + os.path.basename(path)))',
        "tmp = path",
        ("tests/checkpoints/test_checkpoint_sigkill.py",),
    ),
    Mutant(
        "autocast-no-op", "mixed precision really runs in half precision", EVALUATION,
        '    if c.amp == "off":\n        return nullcontext()', "    return nullcontext()",
        (f"{T_TRAINER}::test_mixed_precision_runs_the_forward_in_half_precision",),
    ),
    Mutant(
        "sync-bn-not-converted", "--sync-bn world-size invariance", TRAINER,
        "self.model = convert_sync_batchnorm(self.model)", "pass",
        (f"{T_MODELS}::test_batchnorm_model_is_world_size_invariant_only_with_sync_bn_no"
         "_accumulation_no_dropout",),
    ),
    Mutant(
        "sync-bn-local-statistics", "--sync-bn world-size invariance", SYNC_BN,
        "totals = _sum_over_ranks(torch.cat([x.sum(dims), count]))",
        "totals = torch.cat([x.sum(dims), count]) * dist.get_world_size()",
        (f"{T_MODELS}::test_batchnorm_model_is_world_size_invariant_only_with_sync_bn_no"
         "_accumulation_no_dropout",),
    ),
    Mutant(
        "sync-bn-no-backward-all-reduce", "--sync-bn world-size invariance", SYNC_BN,
        "        total = grad.clone()\n        dist.all_reduce(total)\n",
        "        total = grad.clone()\n",
        (f"{T_MODELS}::test_batchnorm_model_is_world_size_invariant_only_with_sync_bn_no"
         "_accumulation_no_dropout",),
    ),
    Mutant(
        "rank0-skips-a-collective", "every rank issues the same collectives", TRAINER,
        "        dist.all_reduce(train)  # sums over ranks: the mean over every target trained on\n",
        "        if self.ctx.rank:  # a rank-conditional collective\n"
        "            dist.all_reduce(train)\n",
        (f"{T_TRAINER}::test_every_rank_issues_the_same_collectives_through_train_eval_save_and"
         "_logging",),
    ),
    Mutant(
        "predictions-not-reordered", "predict writes each sample's own prediction", EVALUATION,
        "order = index.argsort()", "order = torch.arange(len(index))",
        (f"{T_CLI}::test_train_eval_predict_end_to_end",),
    ),
    Mutant(
        "dataset-serves-prebuilt-batches", "plain DataLoader contract", DATA,
        "    def batch(self, indices: list[int])",
        "    def __getitems__(self, indices: list[int]) -> list:\n"
        "        return [_Batch(self.batch(indices))]\n\n"
        "    def batch(self, indices: list[int])",
        (f"{T_DATA}::test_built_datasets_work_with_a_plain_dataloader_and_default_collation",),
    ),
    Mutant(
        "fingerprint-never-compared", "collective fingerprint: a real mismatch caught",
        CHECK, "    if not _board.all_alike(digest):", "    if False:",
        (f"{T_HARNESS}::test_mismatched_collective_order_fails_naming_both_collectives",),
    ),
    Mutant(
        "board-reads-only-its-own-cell", "collective fingerprint: the board compares every rank's",
        BOARD, "        alike = self._cells[cells : cells + CELL.size * self.size] == "
        "CELL.pack(digest) * self.size",
        "        alike = self._cells[cells + CELL.size * self.rank : cells + CELL.size * (self.rank + 1)]"
        " == CELL.pack(digest)",
        (f"{T_BOARD}::test_every_rank_gets_the_same_true_verdict_at_any_pace",
         f"{T_FINGERPRINT}::test_mismatched_dtypes_fail_naming_both_dtypes"),
    ),
    Mutant(
        "board-one-half", "collective fingerprint: a round's cells are read before the next's",
        BOARD, "        half, self.rounds = self.rounds % 2, self.rounds + 1",
        "        half, self.rounds = 0, self.rounds + 1",
        (f"{T_BOARD}::test_a_rank_slow_to_read_its_round_still_reads_that_rounds_cells",),
    ),
    Mutant(
        "board-unbroken-by-an-interrupted-round",
        "collective fingerprint: a rank out of a round midway fails its next", BOARD,
        "        self.broken = True  # until the round is done\n", "",
        (f"{T_BOARD}::test_a_rank_taken_out_of_a_round_midway_fails_its_next_round",),
    ),
    Mutant(
        "board-count-not-reset", "collective fingerprint: every round completes", BOARD,
        "            CELL.pack_into(self._cells, CELL.size * half, 0 if last else count)",
        "            CELL.pack_into(self._cells, CELL.size * half, count)",
        (f"{T_BOARD}::test_each_halfs_count_is_back_at_0_for_its_next_round",),
    ),
    Mutant(
        "fingerprint-without-shapes", "collective fingerprint: shapes and dtypes", SIGNATURES,
        "        return _tensor_text(value, view)\n", "        return _tensor_text(value, DTYPE)\n",
        (f"{T_SIGNATURES}::test_reductions_compare_shapes_dtypes_and_ops",
         f"{T_HARNESS}::test_mismatched_shapes_fail_naming_the_shapes"),
    ),
    Mutant(
        "fingerprint-without-dtypes", "collective fingerprint: dtypes", SIGNATURES,
        '    dtype = str(t.dtype).removeprefix("torch.")\n', '    dtype = "float32"\n',
        (f"{T_SIGNATURES}::test_reductions_compare_shapes_dtypes_and_ops",
         f"{T_FINGERPRINT}::test_mismatched_dtypes_fail_naming_both_dtypes"),
    ),
    Mutant(
        "fingerprint-without-ops", "collective fingerprint: reduce ops", SIGNATURES,
        '        parts.append(op_name(call["op"]))', "        pass",
        (f"{T_SIGNATURES}::test_reductions_compare_shapes_dtypes_and_ops",
         f"{T_HARNESS}::test_mismatched_reduce_ops_fail_instead_of_silently_disagreeing"),
    ),
    Mutant(
        "fsdp-syncs-every-micro-batch", "FSDP accumulation without gradient sync", PARALLEL,
        "    model.set_requires_gradient_sync(False)", "    model.set_requires_gradient_sync(True)",
        (f"{T_PARALLEL}::test_fsdp_accumulation_skips_the_gradient_reduce_scatter",),
    ),
    Mutant(
        "fsdp-from-own-init", "FSDP ranks start from rank 0's weights (init_from)", PARALLEL,
        "            dist.broadcast(tensor, src=0)", "            pass",
        (f"{T_FSDP}::test_fsdp_starts_from_rank0_weights_like_ddp",),
    ),
    Mutant(
        "fsdp-optimizer-by-name", "FSDP checkpoints keep torch's optimizer layout", PARALLEL,
        "return _names_to_indices(by_name, self.model) if by_name else {}", "return by_name",
        (f"{T_FSDP}::test_fsdp_run_equals_the_ddp_run_with_accumulation_and_clipping",),
    ),
    Mutant(
        "group-held-by-default-args", "a finished run leaves no gloo thread at exit",
        "refddp/launch/dist.py",
        "import torch.distributed.nn.functional  # noqa: F401, E402", "",
        # In the trainer, refddp.checkpoints.dcp's imports happen to load it early too.
        ("tests/launch/test_end_process.py::test_destroying_the_group_after_ddp_stops_gloo_threads",),
    ),
    Mutant(
        "mesh-keeps-the-group", "a finished FSDP run leaves no gloo thread at exit",
        "refddp/launch/dist.py",
        'getattr(mesh, "_pg_registry", {}).clear()', "pass",
        ("tests/launch/test_exit_codes.py"
         "::test_no_gloo_thread_outlives_the_process_group_after_a_run",),
    ),
    Mutant(
        "group-left-to-cyclic-gc", "a finished FSDP run leaves no gloo thread at exit",
        "refddp/launch/dist.py", "        gc.collect()\n", "",
        ("tests/launch/test_exit_codes.py"
         "::test_no_gloo_thread_outlives_the_process_group_after_a_run",),
    ),
    Mutant(
        "plugin-imports-torch-at-session-end", "the plugin costs no torch import",
        "refddp/testing/plugin.py",
        'pools = sys.modules.get("refddp.testing.driver.warm_pools")',
        "import refddp.testing.driver.warm_pools as pools",
        ("tests/harness/test_plugin.py"
         "::test_a_session_without_distributed_tests_never_imports_torch",),
    ),
    Mutant(
        "dcp-optimizer-not-restored", "exact resume from a dcp checkpoint", CKPT_DCP,
        "dcp.load(_flat(model_state, optim_state), storage_reader=_SafeReader(state[KEY]))",
        'dcp.load(_flat(model_state, {"state": {}}), storage_reader=_SafeReader(state[KEY]))',
        (f"{T_DCP}::test_dcp_resume_mid_epoch_is_bit_identical",),
    ),
    Mutant(
        "dcp-drops-run-state", "a dcp checkpoint carries the full format's run state", CKPT_DCP,
        "_publish({**state, LAYOUT: layout}, directory, tmp, is_best)",
        '_publish({**state, "rng_states": [], "samples_in_epoch": 0, LAYOUT: layout}, '
        "directory, tmp, is_best)",
        (f"{T_DCP}::test_a_converted_dcp_checkpoint_is_the_full_checkpoint_of_the_same_run",
         f"{T_DCP}::test_dcp_resume_mid_epoch_is_bit_identical"),
    ),
    Mutant(
        "dcp-written-in-place", "atomic dcp checkpoints", CKPT_DCP,
        "tmp = os.path.join(directory, f\".checkpoint_step{state['step']:08d}.dcp.tmp\")",
        "tmp = os.path.join(directory, LATEST)",
        (f"{T_DCP}::test_a_failed_dcp_save_leaves_latest_on_the_previous_complete_checkpoint",),
    ),
    Mutant(
        "dcp-metadata-unpickled-freely", "loading a dcp checkpoint runs no code", CKPT_DCP,
        "metadata = _MetadataUnpickler(f).load()", "metadata = pickle.load(f)",
        (f"{T_CONVERT}::test_a_metadata_file_that_would_run_code_is_refused_and_runs_nothing",),
    ),
    Mutant(
        "converter-drops-a-key", "the converter writes the full format exactly", CKPT_DCP,
        "if k not in (KEY, LAYOUT)}", 'if k not in (KEY, LAYOUT, "scheduler_state_dict")}',
        (f"{T_DCP}::test_a_converted_dcp_checkpoint_is_the_full_checkpoint_of_the_same_run",),
    ),
    Mutant(
        "fsdp-eval-not-in-lockstep", "every FSDP rank issues the same collectives", EVALUATION,
        "lockstep = runs_in_lockstep(model)", "lockstep = False",
        (f"{T_PARALLEL}::test_every_fsdp_rank_issues_the_same_collectives_with_an_uneven_last"
         "_eval_shard",),
    ),
    Mutant(
        "fingerprint-misses-fsdp", "the fingerprint checks FSDP2's own collectives", COLLECTIVES,
        '    "all_gather_single",  # FSDP2\'s parameter all-gather (torch 2.13)\n', "",
        (f"{T_PARALLEL}::test_every_fsdp_rank_issues_the_same_collectives_with_an_uneven_last"
         "_eval_shard",),
    ),
    Mutant(
        "fsdp-compile-ignored", "--compile compiles under FSDP", PARALLEL,
        "                _compile_forward(block, index)", "                pass",
        (f"{T_FSDP}::test_torch_compile_trains_like_eager[fsdp]",),
    ),
    Mutant(
        "ddp-compile-ignored", "--compile compiles under DDP", PARALLEL,
        "        self.module = torch.compile(self.wrapped) if c.compile else self.wrapped",
        "        self.module = self.wrapped",
        (f"{T_FSDP}::test_torch_compile_trains_like_eager[ddp]",),
    ),
    Mutant(
        "fsdp-compile-shares-one-code-object", "--compile compiles every block of a deep model",
        PARALLEL,
        '    unit_forward.__code__ = unit_forward.__code__.replace(co_name=f"unit_forward_{index}")\n',
        "",
        (f"{T_HF}::test_compile_under_fsdp_compiles_every_one_of_twelve_blocks",),
    ),
    Mutant(
        "objective-check-not-agreed", "bad input: every rank stops alike, no hang", EVALUATION,
        "        problem = next((p for p, _ in found if p), None)\n", "",
        (f"{T_CHECKS}::test_a_problem_one_rank_alone_finds_stops_every_rank_with_its_line",),
    ),
    Mutant(
        "count-ignores-the-shift", "exact normalisation of an HF causal LM's own loss",
        "refddp/workload/objectives/model_loss.py",
        "            labels = batch[LABELS][..., 1:] if self.shifts else batch[LABELS]",
        "            labels = batch[LABELS]",
        (f"{T_SEQ}::test_a_model_that_cannot_be_normalised_exactly_gets_micro_batch_means_and"
         "_says_so",
         f"{T_SEQ}::test_a_hugging_face_gpt2_computing_its_own_loss_gives_the_same_weights_at"
         "_any_split"),
    ),
    Mutant(
        "eval-loss-a-mean-of-batch-means", "exact eval: token-weighted val_loss",
        "refddp/workload/objectives/cross_entropy.py",
        "        return [total.double(), count, correct, count]",
        "        return [total.double() / count, 1, correct, count]",
        (f"{T_SEQ}::test_validation_loss_is_the_mean_over_every_target_token_at_any_world_size",),
    ),
    Mutant(
        "loss-import-not-guarded", "a checkpoint never makes refddp import the loss it names",
        "refddp/config/schema.py", "        resume=REFUSED,\n        imports=True,\n    )\n    metrics: str",
        "        resume=REFUSED,\n    )\n    metrics: str",
        ("tests/checkpoints/test_checkpoint_code.py::test_a_loss_or_metrics_import_named_only_by_a"
         "_checkpoint_is_refused[loss]",),
    ),
    Mutant(
        "ignored-targets-counted-on-the-host", "exact normalisation: -100 targets count nothing",
        DATA, "self.every_target_scored = not bool((y == IGNORE_INDEX).any())",
        "self.every_target_scored = True",
        ("tests/workload/test_objectives.py::test_built_in_data_without_ignored_targets_counts_them"
         "_on_the_host_and_with_them_on_the_device",),
    ),
    Mutant(
        "watchdog-deadline-stays", "hang watchdog: no firing while progress is made", WATCHDOG,
        "        if last != self._armed_for:\n            self._arm(last)", "        pass",
        (f"{T_WATCHDOG}::test_steps_never_touch_the_timer_and_the_helper_rearms_it_for_the_last"
         "_progress",),
    ),
    Mutant(
        "watchdog-helper-idle", "hang watchdog: no firing while progress is made", WATCHDOG,
        "            self.rearm_if_progressed()", "            pass",
        (f"{T_WATCHDOG}::test_the_helper_thread_rearms_after_progress",),
    ),
    Mutant(
        "dcp-save-steps-a-fresh-optimizer", "a dcp save changes nothing (before the first step)",
        CKPT_DCP, "    if not with_optimizer:\n        return get_model_state_dict(parallel.model), {\"state\": {}}\n",
        "",
        (f"{T_FSDP}::test_a_save_before_the_first_applied_step_changes_nothing[dcp]",),
    ),
    Mutant(
        "dcp-published-incomplete", "latest names only a complete dcp checkpoint", CKPT_DCP,
        "    _check_complete(path, metadata)\n", "",
        (f"{T_CONVERT}::test_a_checkpoint_with_a_missing_or_short_shard_file_is_refused",
         f"{T_DCP}::test_a_checkpoint_missing_a_shard_file_is_never_resumed_from"),
    ),
    Mutant(
        "dcp-unread-tensors-escape", "a damaged dcp checkpoint is one line, exit 2", CKPT_DCP,
        "        return _assemble(state, tensors)\n    except (KeyError, IndexError, TypeError, "
        "ValueError) as exc:", "        return _assemble(state, tensors)\n    except ():",
        (f"{T_CONVERT}::test_a_mismatched_or_corrupt_checkpoint_is_one_line_exit_2",),
    ),
    Mutant(
        "dcp-link-resolved-twice", "run state and tensors come from one checkpoint", CKPT_DCP,
        "    path = os.path.realpath(path)\n", "",
        (f"{T_CONVERT}::test_a_link_is_resolved_once_so_tensors_come_from_the_run_states"
         "_checkpoint",),
    ),
    Mutant(
        "dangling-latest-ignored", "resume never silently starts over", CKPT,
        "        if not os.path.lexists(path):\n            continue",
        "        if not os.path.exists(path):\n            continue",
        ("tests/checkpoints/test_checkpoint.py::test_a_dangling_latest_link_is_named_not_taken_for_a"
         "_fresh_start",),
    ),
    Mutant(
        "resume-ignores-dcp", "exact resume from a dcp checkpoint", CKPT,
        "for fmt in checkpoint_formats.every()]", "for fmt in checkpoint_formats.every()[:1]]",
        ("tests/checkpoints/test_checkpoint.py::test_a_dangling_latest_link_is_named_not_taken_for_a"
         "_fresh_start",
         f"{T_DCP}::test_dcp_resume_mid_epoch_is_bit_identical"),
    ),
    Mutant(
        "dcp-publish-unchecked", "latest names only a complete dcp checkpoint", CKPT_DCP,
        "    try:\n        _check_complete(tmp, read_metadata(tmp))\n", "    try:\n        pass\n",
        (f"{T_CONVERT}::test_a_checkpoint_with_a_missing_or_short_shard_file_is_refused",),
    ),
    Mutant(
        "fsdp-save-steps-a-fresh-optimizer", "a save changes nothing (before the first step)",
        PARALLEL, "        if not optimizer.state:  # never stepped", "        if False:  # never stepped",
        (f"{T_FSDP}::test_a_save_before_the_first_applied_step_changes_nothing[full]",),
    ),
    Mutant(
        "fsdp-load-steps-a-fresh-optimizer", "a save changes nothing (before the first step)",
        PARALLEL, "        if not optimizer_state[\"state\"]:  # saved before any step",
        "        if False:  # saved before any step",
        (f"{T_FSDP}::test_a_save_before_the_first_applied_step_changes_nothing[full]",),
    ),
    Mutant(
        "rank-keeps-its-own-config", "node-local --out: every rank runs rank 0's config",
        "refddp/train.py", "    c = dataclasses.replace(c, **taken)\n", "",
        ("tests/checkpoints/test_resume.py::test_a_rank_takes_rank_0s_config_only_where_its"
         "_command_is_silent",
         "tests/checkpoints/test_resume.py::test_two_nodes_with_node_local_out_resume_from_the"
         "_same_state"),
    ),
    Mutant(
        "nodes-disagree-silently", "node-local --out: nodes given different flags are refused",
        "refddp/train.py", "        if name in given or name in JOINED_WITH:",
        "        if False:",
        ("tests/checkpoints/test_resume.py::test_nodes_given_different_flags_stop_in_one_line"
         "_before_training",),
    ),
    Mutant(
        "rank-imports-what-only-rank-0-names", "no code a rank's command does not name is imported",
        "refddp/train.py",
        '        refuse_checkpoint_imports(taken, {"trust_checkpoint_code": c.trust_checkpoint_code})',
        "        pass",
        ("tests/checkpoints/test_resume.py::test_a_rank_takes_rank_0s_config_only_where_its"
         "_command_is_silent",),
    ),
    Mutant(
        "group-joined-with-a-differing-timeout", "nodes joined with different timeouts are refused",
        "refddp/train.py", '        if name in given or name in JOINED_WITH:',
        "        if name in given:",
        ("tests/checkpoints/test_resume.py::test_a_rank_takes_rank_0s_config_only_where_its"
         "_command_is_silent",),
    ),
    Mutant(
        "doctor-report-after-the-ranks-part", "the doctor prints its report whatever rank exits first",
        "refddp/doctor.py", "        rank0_then_meet(lambda: print(report, flush=True))\n",
        "        teardown()\n        if result['rank'] == 0:\n            print(report, flush=True)\n",
        ("tests/commands/test_doctor.py::test_the_report_is_printed_before_any_rank_leaves",),
    ),
    Mutant(
        "run-held-by-the-failing-frames", "a finished run exits 0: no exit deadlock", DIST,
        "        traceback.clear_frames(in_flight.__traceback__)\n    gc.collect()",
        "        pass\n    gc.collect()",
        ("tests/launch/test_end_process.py::test_teardown_frees_the_run_before_it_leaves_the"
         "_group",),
    ),
    Mutant(
        "run-freed-after-the-group", "a finished run exits 0: no exit deadlock", DIST,
        "    if owned:\n        _free_the_run()\n", "",
        ("tests/launch/test_end_process.py::test_teardown_frees_the_run_before_it_leaves_the"
         "_group",),
    ),
    Mutant(
        "a-late-import-closes-a-cycle", "no refddp module imports another back", RUN_STATE,
        "    schedule values, so what config.yaml records is what runs.\n    \"\"\"\n",
        "    schedule values, so what config.yaml records is what runs.\n    \"\"\"\n"
        "    from refddp.checkpoints import loading  # noqa: F401 - loading imports this module\n",
        ("tests/project/test_import_graph.py::test_refddps_modules_import_one_another_without_a"
         "_cycle",),
    ),
    Mutant(
        "an-import-against-the-layout", "each part imports only what the layout allows",
        "refddp/launch/slurm.py", "from refddp.config.schema import ConfigError\n",
        "from refddp.config.schema import ConfigError\n"
        "from refddp.training import watchdog  # noqa: F401 - launch reaching up to training\n",
        ("tests/project/test_import_graph.py::test_every_part_imports_only_what_the_layout_allows",),
    ),
    Mutant(
        "full-checkpoint-left-unread", "the full checkpoint of either format", CKPT,
        "return fmt.load_full(fmt.load_run_state(path))", "return fmt.load_run_state(path)",
        (f"{T_CONVERT}::test_the_full_checkpoint_of_either_format_is_the_plain_files_dict",
         "tests/commands/test_export_trained.py::test_a_trained_dcp_checkpoint_exports_to"
         "_weights_that_evaluate_to_its_metric"),
    ),
    Mutant(
        "mutant-applied-where-its-snippet-repeats", "mutants stay applicable",
        "tests/mutation/run.py",
        "if text.count(mutant.original) != 1:", "if mutant.original not in text:",
        ("tests/project/test_mutants.py::test_a_snippet_found_twice_or_nowhere_makes_a_mutant_not"
         "_applicable",),
    ),
    Mutant(
        "libuv-store-only", "the harness and the launcher start on torch 2.5", DIST,
        "            return _store_on(os.dup(sock.fileno()), port, timeout_s, use_libuv=False)",
        "            raise",
        ("tests/config/test_older_torch.py::test_the_loopback_store_starts_where_libuv_takes_no"
         "_listening_socket",),
    ),
    Mutant(
        "dcp-read-with-a-group-on-torch-2-5", "a dcp checkpoint is read in one process alone",
        CKPT_DCP, "    if \"no_dist\" in inspect.signature(dcp.load).parameters:",
        "    if True:",
        ("tests/config/test_older_torch.py::test_a_dcp_checkpoint_is_read_alone_where_load_has_no"
         "_no_dist",),
    ),
    Mutant(
        "fsdp-on-a-torch-without-fully-shard", "a feature this torch lacks is one line",
        "refddp/config/torch_support.py",
        "    if hasattr(fsdp, \"fully_shard\") and hasattr(fsdp, \"FSDPModule\"):",
        "    if True:",
        ("tests/config/test_torch_support.py::test_fsdp_on_a_torch_without_public_fully_shard_is"
         "_one_line_naming_the_version",),
    ),
    Mutant(
        "launcher-without-its-internals", "a feature this torch lacks is one line",
        "refddp/launch/torchrun.py", "    if not missing:\n        return None",
        "    if True:\n        return None",
        ("tests/launch/test_launcher_report.py::test_a_torch_without_the_launchers_internals_is"
         "_told_to_use_torchrun",),
    ),
    Mutant(
        "private-name-unlisted", "every private torch name is listed with its reason",
        "docs/known-limitations.md", "- A device mesh's `_pg_registry` (`refddp/launch/dist.py`",
        "- A device mesh's registry (`refddp/launch/dist.py`",
        ("tests/project/test_private_names.py::test_every_private_name_refddp_uses_is_listed_with"
         "_its_reason",),
    ),
    Mutant(
        "image-folder-classes-unchecked", "an image folder's splits have the same classes",
        IMAGE_FOLDER, "    if train.classes != val.classes:", "    if False:",
        ("tests/workload/test_image_folder.py::test_a_bad_image_folder_is_one_line_naming_what_to_fix",),
        needs="torchvision",
    ),
    Mutant(
        "image-validation-augmented", "validation images are not augmented", IMAGE_FOLDER,
        'transform=_transforms(v2, c.image_size, split == "train")',
        "transform=_transforms(v2, c.image_size, True)",
        ("tests/workload/test_image_folder.py::test_training_augmentation_is_drawn_per_sample_from_the_seed",),
        needs="torchvision",
    ),
    Mutant(
        "harness-below-the-floor-fails-deep-in-torch", "a torch below the floor is one line",
        "refddp/testing/plugin.py", "    if refused:  # the one line, not a failure deep inside torch",
        "    if False:",
        ("tests/harness/test_plugin.py::test_on_a_torch_below_the_floor_each_distributed_test_fails"
         "_in_one_line",),
    ),
    Mutant(
        "headline-is-the-messages-last-line", "a report's headline is the failing assertion",
        REPORTS, "    how = why if died else exception_line(why)",
        "    how = why if died else _last_line(why)",
        ("tests/harness/test_harness_parity.py::test_the_headline_is_the_failing_assertion_and_a_failed_subtest_fails",),
    ),
    Mutant(
        "own-part-fingerprinted", "collectives torch accepts, the harness accepts", SIGNATURES,
        '    "reduce_scatter": {"output": DTYPE, "input_list": LIST},',
        '    "reduce_scatter": {"output": SHAPE, "input_list": LIST},',
        (f"{T_SIGNATURES}::test_reduce_scatter_compares_the_list_and_the_op_and_the_own_part_by_"
         "dtype_only",
         "tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed"),
    ),
    Mutant(
        "unregistered-group-breaks-tracing", "collectives torch accepts, the harness accepts",
        SIGNATURES, "    except (KeyError, RuntimeError, ValueError):\n        # Built from",
        "    except ZeroDivisionError:\n        # Built from",
        ("tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed",),
    ),
    Mutant(
        "file-name-per-rank", "a PyTorch-style suite runs with its base class changed", UNITTEST,
        "        case._file_name = file_name\n", "",
        ("tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed",),
    ),
    Mutant(
        "torch-skip-code-is-a-failure", "a PyTorch-style suite runs with its base class changed",
        UNITTEST, "        reason = _torch_skip(err[1])", "        reason = None",
        ("tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed",),
    ),
    Mutant(
        "unittest-assert-equal-on-tensors",
        "a PyTorch-style suite runs with its base class changed", UNITTEST,
        "        if not (kwargs or _holds_tensor(first) or _holds_tensor(second)):",
        "        if True:",
        ("tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed",),
    ),
    Mutant(
        "pools-backend-started-anew",
        "a PyTorch-style suite runs with its base class changed", UNITTEST,
        "        if backend is None or pool_backend(str(backend).lower()) == self.backend:",
        "        if backend is None:",
        ("tests/harness/test_harness_parity.py::test_pytorch_style_tests_pass_with_only_the_base_class_changed",),
    ),
    Mutant(
        "tests-share-a-store-namespace", "every test starts clean: its own store namespace",
        "refddp/testing/rank/worker.py", "    leftovers.fresh_namespace()\n", "",
        ("tests/harness/test_harness_parity.py::test_local_synchronisation_groups_pass_test"
         "_after_test_in_one_session",),
    ),
    Mutant(
        "launcher-dies-of-sigusr1", "SIGUSR1 to the launcher stops every rank with a checkpoint",
        "refddp/launch/torchrun.py", "previous = signal.signal(signal.SIGUSR1, _stop_the_agent)",
        "previous = signal.getsignal(signal.SIGUSR1)",
        ("tests/training/test_faults.py::test_sigusr1_to_the_launcher_stops_every_rank_with_a"
         "_checkpoint_exit_138",),
    ),
    Mutant(
        "loader-workers-die-of-sigusr1", "SLURM's signal to a whole step kills no loader worker",
        DATA, "    for sig in StopRequest.SIGNALS:\n        signal.signal(sig, signal.SIG_IGN)",
        "    for sig in (signal.SIGINT, signal.SIGTERM):\n        signal.signal(sig, signal.SIG_IGN)",
        (f"{T_SLURM_ENV}::test_loader_workers_outlive_the_stop_signals_slurm_sends_every"
         "_process",),
    ),
    Mutant(
        "srun-tasks-train-alone", "srun starts one rank per task of one job", DIST,
        "    elif (task := srun_task()) is not None:", "    elif (task := None) is not None:",
        (f"{T_SLURM_TASKS}::test_tasks_with_srun_variables_train_one_job",
         "tests/slurm/test_slurm.py::test_srun_runs_one_rank_per_task_as_one_job_equal_to"
         "_nproc_2"),
    ),
    Mutant(
        "batch-script-taken-for-a-rank", "only a task of an srun step is an srun rank", SLURM,
        '    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:',
        '    if "SLURM_PROCID" not in environ:',
        (f"{T_SLURM_ENV}::test_a_batch_script_or_a_one_task_step_is_no_srun_rank",),
    ),
    Mutant(
        "rendezvous-at-the-last-host", "srun ranks meet on the step's first node", SLURM,
        'host.append(nodelist[i + 1 : end].split(",")[0].split("-")[0])',
        'host.append(nodelist[i + 1 : end].split(",")[-1].split("-")[-1])',
        (f"{T_SLURM_ENV}::test_the_rendezvous_host_is_the_first_of_the_node_list",),
    ),
    Mutant(
        "srun-task-launches-local-ranks", "an srun task is a rank: --nproc refused", "refddp/train.py",
        "        task = srun_task()\n", "        task = None\n",
        (f"{T_SLURM_ENV}::test_nproc_under_a_several_task_step_is_refused_in_one_line",),
    ),
    Mutant(
        "export-tied-weights-shared", "export: tied weights as two tensors, strict load", EXPORT,
        "tensors[key] = value.detach().clone() if shared else value.detach().contiguous()",
        "tensors[key] = value.detach().contiguous()",
        (f"{T_EXPORT}::test_tied_gpt2_weights_are_two_tensors_and_the_directory_loads_offline",),
    ),
    Mutant(
        "export-imports-checkpoint-code", "export imports no code only a checkpoint names", EXPORT,
        '        refuse_checkpoint_imports({"model": spec}, {**given, "trust_checkpoint_code": trust})',
        "        pass",
        (f"{T_EXPORT}::test_code_only_the_checkpoint_names_is_not_imported",),
    ),
    Mutant(
        "export-without-run-metadata", "export: the run's config and step as metadata", EXPORT,
        '"config": json.dumps(config, sort_keys=True), "step": str(step)}', "}",
        (f"{T_EXPORT}::test_the_safetensors_file_loads_strict_into_the_bare_model_with_config"
         "_and_step",),
    ),
    Mutant(
        "export-never-writes-the-hf-directory", "export: a Hugging Face directory", EXPORT,
        "    return transformers is not None and isinstance(model, transformers.PreTrainedModel)",
        "    return False",
        (f"{T_EXPORT}::test_tied_gpt2_weights_are_two_tensors_and_the_directory_loads_offline",),
    ),
    Mutant(
        "export-writes-in-place", "export: a failed write leaves the previous output", EXPORT,
        '    tmp = temp_name(os.path.join(directory, "." + name))',
        "    tmp = os.path.abspath(path)",
        (f"{T_EXPORT}::test_a_failed_write_is_one_line_exit_1_and_leaves_nothing_behind",),
    ),
    Mutant(
        "fault-fires-one-collective-early", "a fault fires exactly at collective k", COLLECTIVES,
        "fault = faults.due_at_collective(_count)", "fault = faults.due_at_collective(_count + 1)",
        (f"{T_FIRES}[kill]",),
    ),
    Mutant(
        "kill-after-the-collective", "a kill fault SIGKILLs the rank inside its collective",
        FAULTS, '    if fault.kind == "kill":\n        os.kill(',
        '    if fault.kind == "kill":\n        call and call()\n        os.kill(',
        (f"{T_FIRES}[kill]",),
    ),
    Mutant(
        "delay-without-delay", "a delay fault makes a straggler", FAULTS,
        "time.sleep(fault.value)", "pass",
        (f"{T_FAULTS}::test_a_delay_makes_rank_k_a_straggler_and_the_test_passes",),
    ),
    Mutant(
        "delay-skips-the-collective", "a delay never fails a test", FAULTS,
        "    return call() if call is not None else None\n", "    return None\n",
        (f"{T_FAULTS}::test_a_delay_makes_rank_k_a_straggler_and_the_test_passes",),
    ),
    Mutant(
        "fault-point-ignored", "a fault fires at a named fault_point", FAULTS,
        "            fire(fault, f\"fault point {name!r}\")", "            pass",
        (f"{T_FAULTS}::test_a_fault_at_a_named_point_fires_there",),
    ),
    Mutant(
        "failure-grace-from-the-first-failure-only",
        "ranks failing one after another are all reported failed", TASKS,
        "            if quiet_until < math.inf or isinstance(replies[rank], FAILURES):\n"
        "                quiet_until = time.monotonic() + FAILURE_GRACE_S\n",
        "            if quiet_until == math.inf and isinstance(replies[rank], FAILURES):\n"
        "                quiet_until = time.monotonic() + FAILURE_GRACE_S\n",
        (f"{T_HARNESS}::test_ranks_failing_one_after_another_are_all_reported_failed_not_still"
         "_running",),
    ),
    Mutant(
        "pool-started-while-a-rank-loads-the-driver-script",
        "a pool started at a driver script's or test module's import is refused in the ranks",
        POOL,
        "        if os.environ.get(LOADING_DRIVER_MODULES):\n",
        "        if False:\n",
        (f"{T_HARNESS}::test_a_driver_script_without_a_main_guard_is_refused_in_the_ranks_not"
         "_run_again",
         "tests/harness/test_plugin.py::test_a_test_module_starting_a_pool_at_import_is_refused"
         "_in_the_ranks"),
    ),
    Mutant(
        "driver-script-flag-left-set",
        "a rank's later tasks run with no trace of the driver script's load", WORKER,
        "        os.environ.pop(LOADING_DRIVER_MODULES, None)\n", "        pass\n",
        (f"{T_HARNESS}::test_driver_needs_no_pytest_and_stops_ranks_with_a_stop_message",),
    ),
    Mutant(
        "mismatch-left-out-of-the-headline", "one error told to every failed rank heads the "
        "report", TASKS,
        "            if len(said) == 1:", "            if False:",
        (f"{T_FAULTS}::test_ranks_that_disagree_on_a_collective_have_no_single_cause",),
    ),
    Mutant(
        "unfired-fault-passes", "a fault that never fires fails the test", TASKS,
        "    if unfired:\n", "    if False:\n",
        (f"{T_FAULTS}::test_a_fault_that_never_fires_fails_the_test",),
    ),
    Mutant(
        "cause-ignores-injected-faults", "the cause is the rank a fault fired on", REPORTS,
        "by_fault = [r for r in failed if r in fired]", "by_fault = []",
        (f"{T_FIRES}[kill]",),
    ),
    Mutant(
        "cause-blames-ranks-failing-in-collectives", "a rank failing in a collective is a victim",
        REPORTS, "outside = [r for r in failed if not _inside(failed[r], slots[r])]",
        "outside = list(failed)",
        (f"{T_FAULTS}::test_ranks_that_disagree_on_a_collective_have_no_single_cause",),
    ),
    Mutant(
        "victims-not-listed", "ranks blocked waiting on the cause are listed", REPORTS,
        "        if reply is None and slot.inside:\n", "        if False:\n",
        (f"{T_FAULTS}::test_the_rank_that_failed_first_is_named_and_the_ranks_waiting_on_it"
         "_listed",),
    ),
    Mutant(
        "one-node-dir-for-every-node", "node_tmp_path is shared by one node's ranks only",
        "refddp/testing/rank/worker.py", "Path(task.node_dirs[ctx.node_rank])", "Path(task.node_dirs[0])",
        (f"{T_NODES}::test_naming_node_local_files_by_rank_passes_on_one_node_and_fails_on_two",),
    ),
    Mutant(
        "local-rank-is-the-global-rank", "simulated nodes give torchrun's LOCAL_RANK", NODES,
        '"LOCAL_RANK": str(local),', '"LOCAL_RANK": str(rank),',
        (f"{T_NODES}::test_each_rank_sees_torchrun_s_variables_for_its_node",),
    ),
    Mutant(
        "one-host-name-for-every-node", "each simulated node has a host name of its own", NODES,
        "    socket.gethostname = lambda: name\n", "",
        (f"{T_NODES}::test_each_rank_sees_torchrun_s_variables_for_its_node",),
    ),
    Mutant(
        "uneven-nodes-accepted", "a world size nnodes does not divide is a one-line error", NODES,
        "    if world_size % nnodes:\n", "    if False:\n",
        (f"{T_NODES}::test_a_node_count_that_does_not_divide_the_world_is_a_one_line_failure",),
    ),
    Mutant(
        "callables-by-reference-only", "lambdas, closures and nested functions run on ranks",
        "refddp/testing/payload.py", "        return cloudpickle.dumps((fn, args, kwargs))\n",
        "        raise TypeError('by reference only')\n",
        (f"{T_HARNESS}::test_lambdas_closures_and_nested_functions_run_on_the_ranks",),
    ),
    Mutant(
        "misused-fixture-unchecked", "a misused fixture fails that one test at setup",
        "refddp/testing/plugin.py", "        if problem is not None:\n            pytest.fail(",
        "        if False:\n            pytest.fail(",
        ("tests/harness/test_plugin_rank_fixtures.py::test_process_bound_fixture_fails_that_test_at"
         "_setup_in_one_line_and_the_rest_run[capsys]",),
    ),
    Mutant(
        "replicas-never-compared", "assert_replicas_equal names the tensor and rank", PARITY,
        "if mine_differs is None and not torch.equal(tensor, theirs):",
        "if mine_differs is None and False:",
        (f"{T_PARITY}::test_a_replica_that_differs_names_the_tensor_and_the_rank",),
    ),
    Mutant(
        "float32-compared-exactly", "assert_matches_single_process: dtype-aware tolerances",
        PARITY, "    torch.float32: (1.3e-6, 1e-5),\n", "    torch.float32: (0.0, 0.0),\n",
        (f"{T_PARITY}::test_tolerances_follow_the_dtype",),
    ),
    Mutant(
        "testcase-shim-missing", "a MultiProcessTestCase suite moves over by its base class",
        "refddp/testing/driver/unittest_case.py",
        "    dist.init_process_group, dist.destroy_process_group = pool.init, pool.destroy\n",
        "",
        (f"{T_PARITY}::test_a_multiprocesstestcase_suite_runs_on_every_rank_after_changing_its"
         "_base_class",),
    ),
    Mutant(
        "meshes-outlive-their-test", "nothing a test builds reaches the next on a warm pool",
        "refddp/testing/rank/leftovers.py", "released = refddp_dist.release_meshes()",
        "released = False",
        (f"{T_PARITY}::test_meshes_and_subgroups_a_test_leaves_are_released_before_the_next",),
    ),
    Mutant(
        "subgroups-outlive-their-test", "nothing a test builds reaches the next on a warm pool",
        "refddp/testing/rank/leftovers.py", "        if name in start.groups:\n            continue\n",
        "        continue\n",
        (f"{T_PARITY}::test_meshes_and_subgroups_a_test_leaves_are_released_before_the_next",),
    ),
    Mutant(
        "groups-freed-under-their-last-collective",
        "a gloo group a test leaves is freed after the test's reply (torch 2.5 deadlocks otherwise)",
        "refddp/testing/rank/leftovers.py", "            _destroyed.append(group)", "            pass",
        (f"{T_PARITY}::test_a_group_a_test_leaves_is_freed_after_the_test_s_reply",),
    ),
    Mutant(
        "destroyed-groups-held-to-the-next-test",
        "a rank left alone in a collective no check sees fails when its peer's group is freed",
        "refddp/testing/rank/worker.py", "        leftovers.free_destroyed()", "        pass",
        (f"{T_PARITY}::test_a_rank_left_alone_in_a_collective_the_check_cannot_see_fails_in_seconds",),
    ),
    Mutant(
        "ranks-started-as-fresh-interpreters", "ranks fork from a server that imported torch once",
        POOL, "        server = rank_server.server()\n", "        server = None\n",
        ("tests/harness/test_rank_server.py::test_ranks_are_forked_from_a_single_threaded_server"
         "_and_are_the_driver_s_children",),
    ),
    Mutant(
        "driver-stays-a-subreaper", "orphans of later tests are not re-parented to pytest",
        "refddp/testing/driver/rank_server.py", "        finally:\n            _set_subreaper(False)\n",
        "        finally:\n            pass\n",
        ("tests/harness/test_rank_server.py::test_ranks_are_forked_from_a_single_threaded_server"
         "_and_are_the_driver_s_children",),
    ),
    Mutant(
        "wrapped-victim-blamed", "a rank whose error was raised from a collective's is a victim",
        COLLECTIVES, "        seen = seen.__cause__ or seen.__context__\n", "        seen = None\n",
        (f"{T_FAULTS}::test_a_victim_that_wraps_its_collective_s_error_is_still_a_victim",),
    ),
    Mutant(
        "tensorboard-keeps-orphaned-points", "a resumed run continues the curves once",
        TENSORBOARD, "purge_step = run.start_step + 1  #", "purge_step = None  #",
        (f"{T_TRACKERS}::test_a_run_resumed_from_an_earlier_checkpoint_continues_the_curves"
         "_once",
         f"{T_TRACKER_UNITS}::test_a_fresh_run_in_a_used_directory_has_only_its_own_history_and"
         "_curves"),
    ),
    Mutant(
        "fresh-run-keeps-the-old-history", "a fresh run in a used directory starts its history",
        "refddp/training/trackers/jsonl.py", "        elif os.path.exists(self.path):  # a fresh run",
        "        elif False:  # a fresh run",
        (f"{T_TRACKER_UNITS}::test_a_fresh_run_in_a_used_directory_has_only_its_own_history_and"
         "_curves",),
    ),
    Mutant(
        "fresh-run-keeps-the-old-curves", "a fresh run in a used directory starts its curves",
        TENSORBOARD, "purge_step = run.start_step + 1  #",
        "purge_step = run.start_step + 1 if run.resumed else None  #",
        (f"{T_TRACKER_UNITS}::test_a_fresh_run_in_a_used_directory_has_only_its_own_history_and"
         "_curves",),
    ),
    Mutant(
        "tensorboard-holds-a-full-batch", "TensorBoard gets the logged steps in batches",
        TENSORBOARD, "if len(self.pending) >= PENDING or now - self.handed_at >= PENDING_S:",
        "if now - self.handed_at >= PENDING_S:",
        (f"{T_TRACKER_UNITS}::test_tensorboard_gets_each_logged_step_as_one_event_in_batches",),
    ),
    Mutant(
        "tensorboard-holds-steps-past-a-checkpoint", "trackers flushed before each checkpoint",
        TENSORBOARD, "            self.hand_over()\n            self.writer.flush()\n",
        "            self.writer.flush()\n",
        (f"{T_TRACKER_UNITS}::test_tensorboard_gets_each_logged_step_as_one_event_in_batches",
         f"{T_TRACKERS}::test_a_killed_rank_0_loses_no_point_logged_before_its_last_checkpoint"),
    ),
    Mutant(
        "straggler-times-in-rank-0s-slot", "history names the slowest rank", STRAGGLERS,
        "vector[rank], vector[world + rank] = ", "vector[0], vector[world] = ",
        (f"{T_STRAGGLERS}::test_a_rank_persistently_slower_is_named_in_history_and_warned_about"
         "[1-forward-1]",),
    ),
    Mutant(
        "straggler-warned-at-the-first-slow-evaluation", "a persistent straggler is warned of",
        STRAGGLERS, "if self.streak != PERSISTENT:", "if self.streak != 1:",
        (f"{T_TRACKER_UNITS}::test_the_straggler_warning_needs_the_same_rank_behind_at"
         "_consecutive_evaluations",),
    ),
    Mutant(
        "profile-starts-a-step-late", "--profile traces exactly its steps", PROFILER,
        "if self.start - 1 <= step < self.end:", "if self.start <= step < self.end:",
        (f"{T_PROFILER}::test_each_rank_writes_a_chrome_trace_of_the_profiled_steps",),
    ),
    Mutant(
        "profile-stops-a-step-late", "--profile traces exactly its steps", PROFILER,
        "        if step >= self.end:\n", "        if step > self.end:\n",
        (f"{T_PROFILER}::test_each_rank_writes_a_chrome_trace_of_the_profiled_steps",),
    ),
    # The step (refddp/training/trainer.py, refddp/training/step_agreement.py): exact normalisation by a count
    # agreed before the backward, the skip decided from the all-reduced gradient's norm.
    Mutant(
        "count-of-one-micro-batch", "exact normalisation over every micro-batch", STEPS,
        "return sum(int(trainer.objective.count(batch)) for batch in micro_batches)",
        "return int(trainer.objective.count(micro_batches[0])) * len(micro_batches)",
        (f"{T_SEQ}::test_token_loss_gives_the_same_weights_at_any_world_size_and_accumulation_split[cross_entropy]",),
    ),
    Mutant(
        "count-not-agreed", "exact normalisation over every rank's targets", AGREEMENT,
        "self._work = dist.all_reduce(sums, async_op=True)",
        "self._work = dist.all_reduce(sums[1:], async_op=True)",
        (f"{T_SEQ}::test_token_loss_gives_the_same_weights_at_any_world_size_and_accumulation"
         "_split[cross_entropy]",),
    ),
    Mutant(
        "token-count-taken-as-samples", "exact normalisation by targets, not samples", STEPS,
        "    if trainer.objective.counts_samples:", "    if True:",
        (f"{T_SEQ}::test_one_step_follows_the_gradient_of_the_mean_over_every_target_of_the"
         "_global_batch",),
    ),
    Mutant(
        "loss-not-scaled", "the gradient is the mean over the global batch", STEPS,
        "trainer.scaler.scale(loss.total * scale).backward()",
        "trainer.scaler.scale(loss.total).backward()",
        (f"{T_SEQ}::test_one_step_follows_the_gradient_of_the_mean_over_every_target_of_the"
         "_global_batch",),
    ),
    Mutant(
        "sync-every-micro-batch", "one gradient all-reduce per optimizer step", STEPS,
        "with contextlib.nullcontext() if last else trainer.parallel.no_sync():",
        "with contextlib.nullcontext():",
        (f"{T_TRAINER}::test_gradients_are_all_reduced_once_per_optimizer_step_whatever_the"
         "_accumulation[3]",),
    ),
    Mutant(
        "clip-scaled-gradient", "unscale before clipping", STEPS,
        "trainer.scaler.unscale_(trainer.optimizer)  # the norm and clipping see the true gradient",
        "pass",
        (f"{T_TRAINER}::test_gradient_clipping_bounds_the_true_gradient_under_amp",),
    ),
    Mutant(
        "nonfinite-loss-not-poisoning-the-gradient", "a non-finite loss is skipped on every rank",
        SKIPPED, "return scale + loss.detach() * 0  # 0 x inf and 0 x nan are nan", "return scale",
        (f"{T_NONFINITE}::test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it[inf-loss-ddp]",),
    ),
    Mutant(
        "nonfinite-gradient-applied", "nothing non-finite reaches the weights", STEPS,
        "    applied = math.isfinite(norm)\n", "    applied = True\n",
        (f"{T_NONFINITE}::test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it[nan-gradient-ddp]",),
    ),
    Mutant(
        "nonfinite-parameters-from-this-rank-only", "a non-finite gradient names its parameters",
        AGREEMENT,
        "    if world_size > 1:\n        dist.all_reduce(flags)\n",
        "    if world_size > 1:\n        dist.all_reduce(flags[:1])\n",
        (f"{T_NONFINITE}::test_a_nan_gradient_in_one_rank_s_shard_is_named_alike_on_every_rank[fsdp-unclipped]",
         f"{T_SKIPPED_STEPS}::test_a_nan_gradient_on_a_parameter_ddp_ignores_stops_every_rank_in_one_line"),
    ),
    Mutant(
        "nonfinite-parameters-unnamed", "a non-finite gradient names its parameters", SKIPPED,
        "    parts = [_listed(found.parameters)] if found.parameters else []\n", "    parts = []\n",
        (f"{T_NONFINITE}::test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it[nan-gradient-ddp]",
         f"{T_NONFINITE}::test_the_nan_gradient_run_says_once_which_step_it_skipped_and_why_and_exits_0"),
    ),
    Mutant(
        "fsdp-gradient-shards-read-as-dtensors", "a non-finite gradient names its parameters",
        AGREEMENT,
        "    if isinstance(grad, DTensor):\n        grad = grad.to_local()\n", "",
        (f"{T_NONFINITE}::test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it[nan-gradient-fsdp]",
         f"{T_NONFINITE}::test_a_nan_gradient_in_one_rank_s_shard_is_named_alike_on_every_rank[fsdp-unclipped]"),
    ),
    Mutant(
        "ignored-parameters-unflagged", "a non-finite gradient names its parameters", AGREEMENT,
        "    if own:\n", "    if False:\n",
        (f"{T_SKIPPED_STEPS}::test_a_nan_gradient_on_a_parameter_ddp_ignores_stops_every_rank_in_one_line",),
    ),
    Mutant(
        "norm-overflow-said-as-a-nonfinite-gradient", "a non-finite gradient names its parameters",
        SKIPPED,
        "    if math.isinf(norm):  # finite gradients overflow to inf, never to NaN\n",
        "    if False:\n",
        (f"{T_NONFINITE}::test_finite_gradients_whose_norm_overflows_are_skipped_and_said_so",),
    ),
    Mutant(
        "clipped-by-a-nan-norm", "a non-finite gradient names its parameters",
        "refddp/training/parallel.py",
        "    finite = torch.nan_to_num(norm, nan=0.0, posinf=0.0, neginf=0.0)\n",
        "    finite = norm\n",
        (f"{T_NONFINITE}::test_a_nan_gradient_in_one_rank_s_shard_is_named_alike_on_every_rank[ddp-clipped]",),
    ),
    Mutant(
        "nonfinite-step-not-counted", "a skipped step is counted and said", STEPS,
        "    pos.skipped_steps += 1\n", "",
        (f"{T_NONFINITE}::test_a_step_non_finite_on_one_rank_is_skipped_on_every_rank_as_one_process_skips_it[nan-gradient-ddp]",),
    ),
    Mutant(
        "on-nonfinite-stop-ignored", "on_nonfinite=stop stops every rank", SKIPPED,
        'if overflow is None and c.on_nonfinite == "stop":', "if False:",
        (f"{T_NONFINITE}::test_every_rank_stops_at_a_non_finite_step_naming_how_many_ranks_losses_were",),
    ),
    Mutant(
        "agreed-stop-not-recorded", "an agreed stop is one line, its cause",
        STEPS, "    recorded = record_error(said, AGREED_STOP)",
        "    recorded = False",
        (f"{T_NONFINITE}::test_on_nonfinite_stop_stops_every_rank_at_that_step_with_one_line"
         "[inf-loss]",),
    ),
    Mutant(
        "launcher-ignores-agreed-stops", "an agreed stop is one line, its cause",
        "refddp/launch/torchrun.py", "    stops = _recorded(failures, AGREED_STOP)\n",
        "    stops: dict[str, list[int]] = {}\n",
        ("tests/launch/test_launcher_report.py::test_an_agreed_stop_is_one_line_however_each_rank"
         "_ended[ended-by-agent]",),
    ),
    Mutant(
        "nonfinite-cause-told-from-this-rank-alone", "the skip's cause, the same on every rank",
        AGREEMENT, "        dist.all_reduce(flags)\n", "        pass\n",
        (f"{T_NONFINITE}::test_every_rank_stops_at_a_non_finite_step_naming_how_many_ranks"
         "_losses_were",),
    ),
    Mutant(
        "fp16-overflow-applied-as-trained", "an fp16 overflow is a skipped step, counted",
        STEPS, "    applied = math.isfinite(norm)\n",
        "    applied = math.isfinite(norm) or trainer.scaling\n",
        (f"{T_DDP}::test_fp16_scaler_skips_overflowing_steps_on_every_rank_alike",),
    ),
    Mutant(
        "stop-signal-not-agreed", "a stop signal stops every rank at the same step", AGREEMENT,
        "        return decode(values)._replace(grad_norm=norm)",
        "        return decode(values)._replace(grad_norm=norm, signal=self.stop.signal or 0)",
        (f"{T_SCENARIOS}::test_a_signal_on_one_rank_mid_epoch_stops_every_rank_at_the_next"
         "_step[3]",),
    ),
    Mutant(
        "agreement-every-step", "the agreement only on the steps that need it", AGREEMENT,
        "if known_total is not None and previous_loss is None and self.check.skip_this_step():",
        "if False:",
        (f"{T_SCENARIOS}::test_steps_that_need_no_agreement_skip_it_and_a_signal_waits_for_the"
         "_next_check",),
    ),
    Mutant(
        "logged-loss-left-behind", "the logged loss reaches the trackers a step late", AGREEMENT,
        "if known_total is not None and previous_loss is None and self.check.skip_this_step():",
        "if known_total is not None and self.check.skip_this_step():",
        (f"{T_TRACKERS}::test_the_training_loss_reaches_the_trackers_with_the_next_steps"
         "_agreement[3]",),
    ),
    Mutant(
        "stop-check-never-due", "a stop signal is agreed at least every stop_check_s", AGREEMENT,
        "        if self.skipped_since_meeting + 1 >= self.every:\n            return False\n",
        "",
        ("tests/training/test_step_agreement.py::test_the_stop_check_meets_once_every_stop_check"
         "_s_of_training",
         f"{T_SCENARIOS}::test_a_signal_on_one_rank_mid_epoch_stops_every_rank_at_the_next"
         "_step[3]"),
    ),
    Mutant(
        "stop-check-interval-ignores-time", "the stop check is due every stop_check_s", AGREEMENT,
        "self.every = max(1, int(min(self.MAX_STEPS, self.every_s * 1e6 / step_us)))",
        "self.every = self.MAX_STEPS",
        ("tests/training/test_step_agreement.py::test_the_stop_check_meets_once_every_stop_check"
         "_s_of_training",),
    ),
    Mutant(
        "float-setting-not-finite", "bad input is one line naming the field",
        "refddp/config/validation.py",
        "    if kind is float and not math.isfinite(value):", "    if False:",
        ("tests/config/test_config.py::test_no_float_setting_takes_a_value_that_is_not_finite",),
    ),
    Mutant(
        "test-deadline-not-checked", "bad input is one line naming the field",
        "refddp/testing/plugin.py", "    why = seconds_error(value)\n", '    why = ""\n',
        ("tests/harness/test_plugin.py::test_a_deadline_that_is_not_a_finite_number_of_seconds_is_one_line_naming_where",),
    ),
    Mutant(
        "unittest-timeout-with-a-traceback", "bad input is one line naming the field",
        "refddp/testing/driver/unittest_case.py", "        why = seconds_error(self.timeout)\n",
        '        why = ""\n',
        ("tests/harness/test_plugin.py::test_a_deadline_that_is_not_a_finite_number_of_seconds_is_one_line_naming_where",
         "tests/harness/test_harness_parity.py::test_a_timeout_that_is_no_deadline_is_one_line_for"
         "_a_result_a_suite_made_itself"),
    ),
    Mutant(
        "unittest-timeout-fails-past-the-suites-result", "bad input is one line naming the field",
        "refddp/testing/driver/unittest_case.py",
        "    if isinstance(result, pytest_item):  # (a plugin's subclass of it too)", "    if True:",
        ("tests/harness/test_harness_parity.py::test_a_timeout_that_is_no_deadline_is_one_line_for"
         "_a_result_a_suite_made_itself",),
    ),
    Mutant(
        "dist-timeout-option-unchecked", "bad input is one line naming the field",
        "refddp/testing/plugin.py", "        type=_seconds_option,", "        type=float,",
        ("tests/harness/test_plugin.py::test_a_deadline_that_is_not_a_finite_number_of_seconds_is_one_line_naming_where",),
    ),
    Mutant(
        "delay-seconds-unchecked", "bad input is one line naming the field",
        "refddp/testing/faults.py",
        "    if not (number and 0 <= seconds <= MAX_WAIT_S):", "    if False:",
        ("tests/harness/test_harness_faults.py::test_bad_faults_are_one_line_errors",),
    ),
    Mutant(
        "doctor-options-unchecked", "bad input is one line naming the field", "refddp/doctor.py",
        "    why = bad_options(args)\n", '    why = ""\n',
        ("tests/commands/test_doctor.py::test_the_doctors_own_bad_options_are_one_line_and_exit_2",),
    ),
    Mutant(
        "hang-timeout-unbounded", "bad input is one line naming the field",
        "refddp/config/validation.py", "    if c.timeout > MAX_WAIT_S:", "    if False:",
        ("tests/config/test_config.py::test_invalid_values_are_one_line_errors_naming_the_field",),
    ),
    Mutant(
        "test-deadline-unbounded", "bad input is one line naming the field",
        "refddp/config/validation.py", "    if not (number and 0 < value <= MAX_WAIT_S):",
        "    if not (number and 0 < value):",
        ("tests/harness/test_plugin.py::test_a_deadline_that_is_not_a_finite_number_of_seconds_is_one_line_naming_where",),
    ),
    Mutant(
        "world-of-no-ranks-runs", "bad input is one line naming the field",
        "refddp/testing/nodes/simulated.py", "    if isinstance(world_size, bool) or count < 1:",
        "    if False:",
        ("tests/harness/test_harness_nodes.py::test_a_world_size_that_is_no_count_of_ranks_is_a"
         "_one_line_failure",),
    ),
    Mutant(
        "fault-on-rank-true", "bad input is one line naming the field", "refddp/testing/faults.py",
        "    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:",
        "    if not isinstance(rank, int) or rank < 0:",
        ("tests/harness/test_harness_faults.py::test_bad_faults_are_one_line_errors",),
    ),
    Mutant(
        "checkpoint-value-over-the-users", "bad input is one line naming the field",
        "refddp/config/command_line.py", "        if key in RUN_FIELDS and key not in given:",
        "        if key in RUN_FIELDS:",
        ("tests/config/test_config.py::test_no_float_setting_takes_a_value_that_is_not_finite",),
    ),
    Mutant(
        "stop-check-interval-overflows", "the stop check is due every stop_check_s", AGREEMENT,
        "self.every = max(1, int(min(self.MAX_STEPS, self.every_s * 1e6 / step_us)))",
        "self.every = max(1, min(self.MAX_STEPS, int(self.every_s * 1e6 / step_us)))",
        ("tests/training/test_step_agreement.py::test_the_stop_check_meets_once_every_stop_check"
         "_s_of_training",),
    ),
    Mutant(
        "stop-check-votes-this-ranks-time", "ranks at different paces meet on the same steps",
        AGREEMENT,
        "        sums = torch.cat([count, loss, self._signal_flags[self.stop.signal], since])\n"
        "        self._work = dist.all_reduce(sums, async_op=True)\n",
        "        sums = torch.cat([count, loss, self._signal_flags[self.stop.signal]])\n"
        "        dist.all_reduce(sums)\n"
        "        sums = torch.cat([sums, since * self.world_size])\n",
        ("tests/training/test_agreement_across_ranks.py::test_ranks_at_different_paces_meet_on"
         "_the_same_steps_and_read_a_signal_together",),
    ),
    Mutant(
        "sigusr1-no-stop-signal", "SLURM's time-limit signal stops every rank with a checkpoint",
        "refddp/launch/stop_signals.py", "SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)",
        "SIGNALS = (signal.SIGTERM, signal.SIGINT)",
        ("tests/training/test_step_agreement.py::test_each_stop_signal_is_read_back_as_itself_and"
         "_the_first_in_signals_wins",
         "tests/training/test_faults.py::test_sigusr1_to_the_launcher_stops_every_rank_with_a"
         "_checkpoint_exit_138"),
    ),
    Mutant(
        "ranks-name-different-stop-signals", "every rank names the same stop signal", AGREEMENT,
        "                   if raised), 0)  # fmt: skip",
        "                   if raised), 0) if not flags[0] else int(StopRequest.SIGNALS[-1])",
        ("tests/training/test_step_agreement.py::test_each_stop_signal_is_read_back_as_itself_and"
         "_the_first_in_signals_wins",),
    ),
    Mutant(
        "count-in-float32", "the target count is exact past 2**24", AGREEMENT,
        "count = torch.full((1,), float(targets), dtype=torch.float64, device=self.device)",
        "count = torch.full((1,), float(targets), dtype=torch.float32, device=self.device).double()",
        ("tests/training/test_agreement_across_ranks.py::test_the_agreement_sums_every_ranks_count"
         "_loss_and_stop_signal",),
    ),
    Mutant(
        "no-settle-before-an-evaluation", "the last step's loss and a late stop are agreed",
        TRAINER, "            signum = self.settle() or signum", "            pass",
        (f"{T_TRACKERS}::test_the_training_loss_reaches_the_trackers_with_the_next_steps"
         "_agreement[4]",),
    ),
    Mutant(
        "step-loss-is-rank-0s-own", "the trackers' loss is the global mean", AGREEMENT,
        "            loss = loss_sum / targets if targets else math.nan",
        "            loss = float(self.held[1]) * dist.get_world_size() / targets",
        ("tests/training/test_trackers.py::test_tensorboard_and_wandb_show_the_runs_curves",),
    ),
    Mutant(
        "step-loss-logged-every-step", "the loss every --log-every steps", AGREEMENT,
        "due = bool(self.every) and step % self.every == 0", "due = bool(self.every)",
        ("tests/training/test_trackers.py::test_the_training_loss_reaches_the_trackers_with_the_next_steps_agreement[3]",),
    ),
    Mutant(
        "trackers-not-flushed-before-a-checkpoint", "trackers flushed before each checkpoint",
        TRAINER,
        "        self.trackers.flush()  # what they logged up to here survives a kill: resume "
        "goes on\n",
        "",
        # The counting test first (seconds): one flush per checkpoint, before it is written;
        # the killed run then loses the steps TensorBoard still held at its checkpoint.
        (f"{T_TRACKERS}::test_the_training_loss_reaches_the_trackers_with_the_next_steps"
         "_agreement[3]",
         f"{T_TRACKERS}::test_a_killed_rank_0_loses_no_point_logged_before_its_last_checkpoint"),
    ),
    Mutant(
        "straggler-compute-includes-the-wait", "a rank's compute excludes waiting for others",
        STEPS, "with window.computing(not (last and trainer.several)):",
        "with window.computing():",
        (f"{T_STRAGGLERS}::test_a_rank_persistently_slower_is_named_in_history_and_warned_about"
         "[0-forward-1]",),
    ),
    Mutant(
        "straggler-backward-not-timed", "a rank slow in its backward is named", STEPS,
        "with window.computing(not (last and trainer.several)):",
        "with window.computing(False):",
        (f"{T_STRAGGLERS}::test_a_rank_persistently_slower_is_named_in_history_and_warned_about"
         "[1-backward-2]",),
    ),
    Mutant(
        "fused-fsdp-sgd-on-cuda", "on CUDA the optimizer is fused where torch has the kernel",
        RUN_SETUP, 'return device.type == "cuda" and has_fused_kernel(c) and not skips_unsafely',
        'return device.type == "cuda" and not skips_unsafely',
        ("tests/config/test_config.py::test_the_optimizer_is_fused_on_cuda_where_torch_has_the_kernel",),
    ),
    Mutant(
        "fused-sgd-under-fp16", "fp16's skipped first step never leaves SGD's momentum unset",
        RUN_SETUP, '    skips_unsafely = c.amp == "fp16" and c.optimizer == "sgd"\n',
        "    skips_unsafely = False\n",
        ("tests/config/test_config.py::test_the_optimizer_is_fused_on_cuda_where_torch_has_the_kernel",),
    ),
    Mutant(
        "cuda-optimizer-unfused", "on CUDA the optimizer is fused", TRAINER,
        "        fused = run_setup.fuses_on_cuda(c, self.device)\n", "        fused = False\n",
        (f"{T_KERNELS}::test_the_trainer_fuses_its_optimizer_where_cuda_has_the_kernel[world_size=1-True]",),
    ),
    Mutant(
        "resume-takes-the-saved-kernels", "a resumed run keeps its own optimizer kernels",
        RUN_STATE,
        "    _keep_kernels(state[\"optimizer_state_dict\"][\"param_groups\"], parts.optimizer)\n",
        "",
        (f"{T_KERNELS}::test_a_run_resumes_with_this_invocations_optimizer_kernels[ddp-full]",),
    ),
    Mutant(
        "fp16-nonfinite-loss-lowers-the-scale", "a non-finite loss is no fp16 overflow", SKIPPED,
        "    if not bad_loss and after < kept[\"scale\"]:", "    if after < kept[\"scale\"]:",
        (f"{T_NONFINITE}::test_under_fp16_a_non_finite_loss_is_skipped_and_keeps_the_loss_scale",
         "tests/training/test_skips.py::test_grad_scaler_backs_off_for_an_overflow_only"),
    ),
    Mutant(
        "agreement-blocks-the-forward", "the agreement overlaps the forward", AGREEMENT,
        "self._work = dist.all_reduce(sums, async_op=True)",
        "self._work = dist.all_reduce(sums, async_op=False)",
        ("tests/training/test_step_agreement.py::test_a_count_past_float32s_integers_comes_back"
         "_exact",),
        equivalent="overlapping the count's all-reduce with the forward is a matter of speed: "
        "a blocking all-reduce agrees the same sums, and no CPU test can time the overlap",
    ),
    Mutant(
        "clipping-reduces-the-norm-again", "one all-reduce for the norm and clipping", PARALLEL,
        "        clip_grads_with_norm_(parameters, max_norm, finite)\n",
        "        nn.utils.clip_grad_norm_(parameters, max_norm)\n",
        (f"{T_PARALLEL}::test_the_gradient_norm_is_every_ranks_alike_for_one_all_reduce_at"
         "_most[fsdp-1]",),
    ),
    Mutant(
        "logged-loss-sent-by-rank-0-alone", "the trackers' loss is the global mean", TRAINER,
        "        logs_steps = any(name != trackers.ALWAYS for name in list_items(c.log_to))\n",
        "        logs_steps = self.trackers.logs_steps\n",
        (f"{T_TRACKERS}::test_tensorboard_and_wandb_show_the_runs_curves",),
    ),
    Mutant(
        "user-loss-count-unchecked", "a user loss's count is the one counted before its forward",
        "refddp/workload/objectives/user_loss.py", "            if returned != counted:",
        "            if False:",
        ("tests/workload/test_objectives.py::test_a_user_losss_count_must_be_the_one_counted_before"
         "_the_forward",),
    ),
    Mutant(
        "no-norm-before-torch-2-6", "the skip's norm without get_total_norm", PARALLEL,
        "return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))",
        "return torch.stack([torch.linalg.vector_norm(g) for g in grads]).sum()",
        ("tests/training/test_total_norm.py::test_the_total_norm_is_clippings_with_or_without"
         "_get_total_norm",),
    ),
    Mutant(
        "cpu-norm-through-get-total-norm", "the skip's norm on the CPU, at half the cost",
        PARALLEL, "if get_total_norm is not None and not one_cpu_kind:",
        "if get_total_norm is not None:",
        ("tests/training/test_total_norm.py::test_on_the_cpu_the_norm_of_norms_has_get_total"
         "_norms_bits",),
        equivalent="get_total_norm gives the same bits on the CPU (the test proves it), only "
        "slower: the saving is speed, measured in benchmarks/README.md, which no test can time",
    ),
    Mutant(
        "cpu-norm-of-mixed-dtypes", "the skip's norm on the CPU has get_total_norm's bits",
        PARALLEL, "g.is_cpu and g.dtype == grads[0].dtype", "g.is_cpu",
        ("tests/training/test_total_norm.py::test_on_the_cpu_the_norm_of_norms_has_get_total"
         "_norms_bits",),
    ),
    Mutant(
        "objectives-not-compared-across-ranks", "ranks whose losses count differently stop",
        EVALUATION, "if problem is None and 0 < len(per_sample) < ctx.world_size:", "if False:",
        ("tests/workload/test_objective_checks.py::test_ranks_whose_losses_count_differently"
         "_stop_before_any_step",),
    ),
    Mutant(
        "async-wait-untraced",
        "a rank skipping any collective is named in seconds",
        COLLECTIVES,
        "    dist.Work.wait = _traced_wait\n",
        "",
        (f"{T_SKIPPED}::test_async_reduce_scatter_skipped_by_one_rank_is_named_within_seconds",),
    ),
    Mutant(
        "only-confirmed-ranks-named",
        "a rank skipping any collective is named in seconds",
        TASKS,
        "    return doomed if confirmed else []",
        "    return [r for r in doomed if now - suspects[r][1] >= ONE_SIDED_CONFIRM_S]",
        (f"{T_SKIPPED}::test_async_reduce_scatter_skipped_by_one_rank_is_named_within_seconds",),
        equivalent="ranks become blocked for good together, when the last rank that could "
        "help stops being able to (blocked_for_good's fixed point), so their confirmation "
        "timers start at the same poll; only a blocked rank whose slot text changes (a retry "
        "loop re-entering its collective) would tell the two apart",
    ),
    Mutant(
        "peer-of-a-receive-ignored",
        "a rank skipping any collective is named in seconds",
        COLLECTIVES,
        '        return "?" if peer is None else str(peer)',
        '        return "?"',
        (f"{T_SKIPPED}::test_receive_from_a_rank_that_finished_is_named_while_others_still_work",),
    ),
    Mutant(
        "late-member-taken-for-a-hang",
        "a correct program is never reported as a hang",
        REPORTS,
        "            if rank not in live and any(m in live for m in members(rank) - {rank}):",
        "            if False:",
        (f"{T_SKIP_BLAME}::test_a_root_waiting_for_a_member_still_on_its_way_is_not_blocked_for_good",
         f"{T_SKIPPED}::test_a_root_waiting_for_a_late_member_is_no_hang"),
    ),
    Mutant(
        "outsider-blamed-for-a-subgroup",
        "a rank skipping any collective is named in seconds",
        REPORTS,
        "        needed = finished if slot.on_world or slot.members is None else slot.members & finished",
        "        needed = finished",
        (
            f"{T_SKIP_BLAME}::test_a_finished_rank_outside_the_subgroup_is_not_blamed",
            f"{T_SKIPPED}::test_subgroup_collective_skipped_blames_the_member_not_the_outsider",
        ),
    ),
    Mutant(
        "ranks-through-the-collective-blamed",
        "a rank skipping any collective is named in seconds",
        REPORTS,
        "        absent |= short or needed",
        "        absent |= needed",
        (f"{T_SKIP_BLAME}::test_a_rank_that_went_through_the_collective_is_not_blamed",),
    ),
    Mutant(
        "failed-in-a-skipped-collective-unblamed",
        "a rank skipping any collective is named in seconds",
        TASKS,
        "        elif absent:\n",
        "        elif False:\n",
        (f"{T_SKIPPED}::test_subgroup_collective_skipped_blames_the_member_not_the_outsider",),
    ),
    Mutant(
        "cluster-outlives-its-test", "a cluster leaves nothing behind", CLUSTER,
        "            remove([n.namespace for n in self.nodes] + [self.switch], self._enter())\n",
        "            pass\n",
        (f"{T_CLUSTER}::test_each_node_has_its_host_name_and_address_and_nothing_outlives_the_cluster",),
    ),
    Mutant(
        "no-reaper-for-a-killed-run", "a cluster leaves nothing behind", NAMESPACES,
        "        _reap(sys.argv[2:])", "        pass",
        (f"{T_CLUSTER}::test_a_killed_test_run_leaves_no_namespace_behind",),
    ),
    Mutant(
        "dead-runs-clusters-kept", "a cluster leaves nothing behind", NAMESPACES,
        "    remove(stale)\n", "",
        (f"{T_CLUSTER}::test_a_new_cluster_removes_what_a_dead_process_left",),
    ),
    Mutant(
        "node-names-unresolvable", "nodes resolve each other by host name", CLUSTER,
        "                f.write(hosts)", "                f.write('')",
        (f"{T_CLUSTER}::test_each_node_has_its_host_name_and_address_and_nothing_outlives_the_cluster",),
    ),
    Mutant(
        "lost-node-unnamed", "a node lost mid-run is named", "refddp/train.py",
        "        lost = None if os.environ.get(LAUNCHED_ENV) else lost_peer(exc)\n",
        "        lost = None\n",
        (f"{T_CLUSTER}::test_a_node_killed_mid_run_ends_the_job_in_seconds_and_the_rerun_is_exact",),
    ),
    Mutant(
        "missing-gloo-interface-passes", "the doctor finds each planted network fault", NETWORK,
        "        if missing:\n", "        if False:\n",
        (f"{T_NETWORK}::test_a_gloo_interface_that_is_not_there_is_named",),
    ),
    Mutant(
        "loopback-host-name-passes", "the doctor finds each planted network fault", NETWORK,
        "    if ipaddress.ip_address(address).is_loopback:", "    if False:",
        ("tests/launch/test_network_checks.py::test_loopback_is_a_problem_only_for_a_job_of_several_nodes",
         f"{T_NETWORK}::test_a_host_name_resolving_to_loopback_is_named"),
    ),
    Mutant(
        "foreign-host-name-passes", "the doctor finds each planted network fault", NETWORK,
        "    if owner is None:\n", "    if False:\n",
        (f"{T_NETWORK}::test_two_nodes_with_one_host_name_are_named",),
    ),
    Mutant(
        "unreachable-master-passes", "the doctor finds each planted network fault", NETWORK,
        '        return f"unreachable ({why})", [', '        return f"unreachable ({why})", [][:0] and [',
        (f"{T_NETWORK}::test_an_unreachable_master_is_named",),
    ),
    Mutant(
        "rank-runs-listed-one-by-one", "a failure among many ranks reads as a screenful",
        RANK_LISTS, "        if j - i >= 2:\n", "        if False:\n",
        (f"{T_RANK_LISTS}::test_runs_of_ranks_are_written_as_ranges",),
    ),
    Mutant(
        "victims-listed-one-by-one", "a failure among many ranks reads as a screenful",
        REPORTS, "        lines += [\"    \" + d for d in group_rank_lines(map(_same_for_every_process, details))]",
        "        lines += [\"    \" + d for d in details]",
        (f"{T_SCALE}::test_at_64_ranks_a_failure_reads_as_its_cause_and_one_line_of_victims",),
    ),
    Mutant(
        "stacks-told-apart-by-thread-id", "a failure among many ranks reads as a screenful",
        REPORTS, "    return _PEER_PORT.sub(r\"\\1:…\", _THREAD_ID.sub(\"0x…\", text))",
        "    return _PEER_PORT.sub(r\"\\1:…\", text)",
        (f"{T_RANK_LISTS}::test_a_thousand_ranks_stopped_at_one_place_make_one_stack_and_a_screenful",
         f"{T_SCALE}::test_at_64_ranks_a_failure_reads_as_its_cause_and_one_line_of_victims"),
    ),
    Mutant(
        "every-distinct-failure-in-full", "a failure among many ranks reads as a screenful",
        REPORTS, "            if shown < room:", "            if True:",
        (f"{T_RANK_LISTS}::test_past_the_first_distinct_failures_each_kind_takes_one_line",),
    ),
    Mutant(
        "mismatch-listed-rank-by-rank", "a failure among many ranks reads as a screenful",
        CHECK, "    groups = rank_lists.group(listed)",
        "    groups = [([r], s) for r, s in listed]",
        (f"{T_SCALE}::test_at_64_ranks_a_collective_mismatch_names_the_two_groups_not_64_lines",),
    ),
    Mutant(
        "idle-gloo-threads-wake-every-10-ms", "1,024 ranks on one machine", WORKER,
        "    prctl(_PR_SET_TIMERSLACK, IDLE_LOOP_SLACK_NS, 0, 0, 0)\n", "",
        (f"{T_SERVER}::test_idle_gloo_threads_wake_coarsely_while_the_rank_keeps_precise_sleeps",),
    ),
    Mutant(
        "gloo-full-mesh-at-start", "1,024 ranks on one machine", POOL,
        '        env.setdefault("TORCH_GLOO_LAZY_INIT", "1")\n', "        pass\n",
        (f"{T_SERVER}::test_a_large_fresh_pool_connects_its_ranks_on_first_use_not_all_pairs_at_start",),
    ),
    Mutant(
        "preload-never-imported", "1,024 ranks on one machine", SERVER,
        '    _preload(os.environ.get(PRELOAD_ENV, ""), os.environ.get(_PRELOAD_PATH_ENV, ""))\n',
        "",
        (f"{T_SERVER}::test_preloaded_modules_are_imported_once_by_the_server_not_by_each_rank",),
    ),
    Mutant(
        "server-forks-with-a-thread-running", "1,024 ranks on one machine", SERVER,
        "    if _has_other_threads():  # a fork copies locks other threads may hold",
        "    if False:",
        (f"{T_SERVER}::test_a_preloaded_module_that_starts_a_thread_leaves_ranks_to_fresh_interpreters",),
    ),
    Mutant(
        "slow-node-measured-against-the-median", "a slow node's ranks are named", "refddp/training/stragglers.py",
        "    bar = others * (1 + LAG_SHARE)", "    bar = statistics.median(busy) * (1 + LAG_SHARE)",
        ("tests/training/test_watching_a_run.py::test_a_slow_node_s_ranks_are_behind_together_and_named_with_their_node",),
    ),
    Mutant(
        "slow-node-never-named", "a slow node's ranks are named", "refddp/training/stragglers.py",
        "    return f\"{said} ({'node' if len(nodes) == 1 else 'nodes'} {', '.join(map(str, nodes))})\"",
        "    return said",
        ("tests/training/test_watching_a_run.py::test_a_slow_node_s_ranks_are_behind_together_and_named_with_their_node",
         f"{T_CLUSTER}::test_a_slow_node_is_named_with_its_ranks_by_the_straggler_report"),
    ),
    Mutant(
        "node-throttle-does-nothing", "a slow node's ranks are named", CLUSTER,
        "                signal_all(pids, signal.SIGSTOP)\n", "",
        (f"{T_CLUSTER}::test_a_slow_node_is_named_with_its_ranks_by_the_straggler_report",),
    ),
    Mutant(
        "victims-told-apart-by-a-peer-s-port", "a failure among many ranks reads as a screenful",
        REPORTS, "    return _PEER_PORT.sub(r\"\\1:…\", _THREAD_ID.sub(\"0x…\", text))",
        "    return _THREAD_ID.sub(\"0x…\", text)",
        (f"{T_RANK_LISTS}::test_victims_whose_errors_differ_only_in_a_peer_s_port_share_one_line",),
    ),
    Mutant(
        "failing-rank-hidden-past-the-cap", "a failure among many ranks reads as a screenful",
        REPORTS, "        order = sorted(range(self.world_size), key=lambda r: r not in failures)",
        "        order = range(self.world_size)",
        (f"{T_RANK_LISTS}::test_the_failing_rank_is_shown_in_full_whatever_its_number",),
    ),
    Mutant(
        "slow-node-streak-on-the-slowest-rank", "a slow node's ranks are named", "refddp/training/stragglers.py",
        "        key = slowest // self.ranks_per_node if self.ranks_per_node else slowest",
        "        key = slowest",
        ("tests/training/test_watching_a_run.py::test_a_slow_node_stays_named_while_its_very_slowest_rank_changes",),
    ),
    Mutant(
        "real-node-keeps-the-machine-s-host-name", "a user's test with nodes(2, real=True) sees two machines",
        NODES, '    _libc_call("sethostname", name, len(name))\n', "",
        (f"{T_REAL}::test_each_node_s_ranks_see_their_node_s_host_name_address_and_directory",),
    ),
    Mutant(
        "real-node-without-its-hosts-file", "a user's test with nodes(2, real=True) sees two machines",
        NODES, '    _libc_call("mount", os.environ[HOSTS_ENV].encode(), b"/etc/hosts", None, _MS_BIND, None)\n',
        "",
        (f"{T_REAL}::test_each_node_s_ranks_see_their_node_s_host_name_address_and_directory",),
    ),
    Mutant(
        "real-node-ranks-stay-on-the-machine-s-network", "a user's test with nodes(2, real=True) sees two machines",
        NODES, '    _libc_call("setns", node_network, _CLONE_NEWNET)\n    os.close(node_network)\n',
        "    os.close(node_network)\n",
        (f"{T_REAL}::test_node_addresses_reach_across_the_bridge_and_loopback_stays_on_the_node",
         f"{T_REAL}::test_a_node_s_link_cut_at_a_collective_is_a_hang_reported_with_the_cut_named"),
    ),
    Mutant(
        "real-node-gloo-on-loopback", "a user's test with nodes(2, real=True) sees two machines",
        WORKER, "    if not nodes.on_real_node():  # (there gloo binds the node's interface)\n",
        "    if True:\n",
        (f"{T_REAL}::test_a_node_s_link_cut_at_a_collective_is_a_hang_reported_with_the_cut_named",),
    ),
    Mutant(
        "real-node-store-sought-on-the-node", "a user's test with nodes(2, real=True) sees two machines",
        WORKER, "    with nodes.host_network():  # (a real node's rank reaches the store on this machine's)\n",
        "    with contextlib.nullcontext():\n",
        (f"{T_REAL}::test_node_addresses_reach_across_the_bridge_and_loopback_stays_on_the_node",),
    ),
    Mutant(
        "loader-workers-fork-where-a-fork-can-deadlock", "a rank's loader workers cannot deadlock at their fork",
        DATA, '    return "forkserver"\n', "    return None\n",
        ("tests/workload/test_worker_start.py::test_on_such_a_python_workers_are_not_forked_from_the_rank",
         "tests/workload/test_worker_start.py::test_auto_starts_workers_from_a_forkserver_only_where_a_fork_can_deadlock"),
    ),
    Mutant(
        "unpicklable-dataset-fails-under-auto", "a rank's loader workers cannot deadlock at their fork",
        DATA, '            self.multiprocessing_context = "fork"\n', "            raise\n",
        ("tests/workload/test_worker_start.py::test_a_dataset_workers_cannot_get_from_a_forkserver_loads_through_forked_ones_warned_once",),
    ),
    Mutant(
        "fork-deadlock-fixed-earlier-than-it-was", "a rank's loader workers cannot deadlock at their fork",
        DATA, "_FORK_DEADLOCK_FIXED_IN = {(3, 10): 15, (3, 11): 10}", "_FORK_DEADLOCK_FIXED_IN = {(3, 10): 15, (3, 11): 7}",
        ("tests/workload/test_worker_start.py::test_the_pythons_whose_forked_children_can_deadlock",),
    ),
    Mutant(
        "node-kill-takes-one-rank", "a node killed or cut in the harness is named",
        FAULTS, "(label, tuple(pids[r] for r in ranks))", "(label, tuple(pids[r] for r in ranks[:1]))",
        (f"{T_NODES}::test_a_node_killed_at_a_collective_is_reported_as_lost_with_its_ranks",),
    ),
    Mutant(
        "lost-node-not-in-the-headline", "a node killed or cut in the harness is named",
        TASKS, "        headline = _lost_nodes(pool, replies, fired) + headline\n", "",
        (f"{T_NODES}::test_a_node_killed_at_a_collective_is_reported_as_lost_with_its_ranks",),
    ),
    Mutant(
        "node-cut-leaves-the-link-up", "a node killed or cut in the harness is named",
        FAULTS, "        done = subprocess.run(list(fault.value[1]), capture_output=True, text=True)\n",
        "        done = subprocess.CompletedProcess([], 0)\n",
        (f"{T_REAL}::test_a_node_s_link_cut_at_a_collective_is_a_hang_reported_with_the_cut_named",),
    ),
    Mutant(
        "real-node-mounts-private", "a user's test with nodes(2, real=True) sees two machines",
        NODES, "_libc_call(\"mount\", b\"none\", b\"/\", None, _MS_REC | _MS_SLAVE, None)",
        "_libc_call(\"mount\", b\"none\", b\"/\", None, _MS_REC | (1 << 18), None)",
        (f"{T_REAL}::test_a_closed_pool_s_namespaces_are_gone_from_another_pool_s_ranks",),
        equivalent="Linux (3.18+) detaches a mount in every mount namespace when its mount point "
        "is unlinked, as `ip netns del` does, so a closed pool's namespaces leave other pools' "
        "ranks with private propagation too; slave is kept because it is what `ip netns exec` "
        "does (mounts made on the machine later still reach the rank)",
    ),
    Mutant(
        "no-cluster-without-root", "a cluster without root, in a user namespace",
        NAMESPACES, '        return "user", ""\n', '        return "", "not root"\n',
        (T_UNPRIVILEGED,),
    ),
    Mutant(
        "user-namespace-node-keeps-the-machines-hosts", "a cluster without root, in a user namespace",
        CLUSTER, """'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'""",
        """'hostname "$0" && shift && exec "$@"'""",
        (T_UNPRIVILEGED,),
    ),
    Mutant(
        "user-namespace-node-starts-at-root", "a cluster without root, in a user namespace",
        CLUSTER, "return [*self._enter(where), ", "return [*self._enter(), ",
        (T_UNPRIVILEGED,),
    ),
    Mutant(
        "user-namespace-reaper-keeps-hosts-files", "a cluster without root, in a user namespace",
        NAMESPACES, "        shutil.rmtree(hosts_dir, ignore_errors=True)\n", "        pass\n",
        (T_UNPRIVILEGED,),
    ),
    Mutant(
        "harness-real-nodes-tried-without-root", "a cluster without root, in a user namespace",
        CLUSTER, "    if in_user_namespace():\n", "    if False:\n",
        (T_UNPRIVILEGED,),
    ),
    Mutant(
        "rejoined-node-looks-for-another-attempt", "a node killed and started again rejoins",
        DIST, "    if not agents:\n        return store\n", "",
        (f"{T_CLUSTER}::test_a_killed_node_started_again_rejoins_under_max_restarts_and_the_job_ends_exact",),
    ),
    Mutant(
        "restarted-ranks-read-the-last-attempt", "a node killed and started again rejoins",
        DIST, '    return dist.PrefixStore(f"refddp/attempt_{attempt}", store)', "    return store",
        ("tests/training/test_faults.py::test_sigkilled_rank_is_restarted_and_the_run_ends_bit_identical",),
    ),
    Mutant(
        "lint-rank-branch-unchecked", "the lint finds collectives only some ranks reach", LINT_RULES,
        "                self.check(node, lambda why, n=node, h=here: self.branch(n, h, why))\n",
        "                pass\n",
        (lint_case("barrier_in_rank0_branch.py"), lint_case("ternary_and_short_circuit.py")),
    ),
    Mutant(
        "lint-symmetric-sides-compared-as-written", "the lint passes code every rank runs alike", LINT_RULES,
        "        if [x.key for x, _ in fa] == [y.key for y, _ in fb]:\n            return\n", "",
        (lint_case("early_exit_fixed.py"), lint_case("symmetric_branches.py")),
    ),
    Mutant(
        "lint-early-exit-ignored", "the lint finds collectives only some ranks reach", LINT_RULES,
        "        fallers = [f for f, end in ((fa, end_a), (fb, end_b)) if end is None] or [fa, fb]\n",
        "        fallers = []\n",
        (lint_case("early_exit.py"),),
    ),
    Mutant(
        "lint-rank-loop-ignored", "the lint finds collectives only some ranks reach", LINT_RULES,
        "        for site in sites(body):\n            self.report(site.node, \"RDL103\",",
        "        for site in ():\n            self.report(site.node, \"RDL103\",",
        (lint_case("rank_dependent_loops.py"),),
    ),
    Mutant(
        "lint-passed-functions-unchecked", "the lint finds collectives only some ranks reach",
        "refddp/lint/callers.py",
        "                issued = [i for i in map(self.seq.issues, functions) if i]\n",
        "                issued = []\n",
        (lint_case("rank0_helpers.py"),),
    ),
    Mutant(
        "lint-callers-rank-dependent-values-unchecked",
        "the lint finds collectives only some ranks reach", "refddp/lint/callers.py",
        "                    if facts.rank and key not in self.findings:\n",
        "                    if False:\n",
        (lint_case("rank0_helpers.py"),),
    ),
    Mutant(
        "lint-shared-end-blamed", "the lint passes code every rank runs alike", LINT_RULES,
        "        if not leaving:\n            fa, fb = fa[: len(fa) - e], fb[: len(fb) - e]\n", "",
        (lint_case("early_exit.py"), T_LINT_PROPS),
    ),
    Mutant(
        "lint-subgroup-membership-reported", "the lint passes code every rank runs alike",
        LINT_RULES, "        if site.group and self.membership:", "        if False:",
        (lint_case("cannot_tell.py"),),
    ),
    Mutant(
        "lint-tuple-assignment-blurred", "the lint passes code every rank runs alike", LINT_FLOW,
        "            if len(targets) == 1 and _pairs(targets[0], node.value):  # a, b = x, y",
        "            if False:",
        (lint_case("launcher_variables_fixed.py"),),
    ),
    Mutant(
        "lint-loop-over-a-sized-list-flagged", "the lint passes code every rank runs alike",
        LINT_IR, "        if length and facts.sized:", "        if False:",
        (lint_case("rank_dependent_loops_fixed.py"),),
    ),
    Mutant(
        "lint-unresolved-calls-silent", "notes for what the lint cannot see into", LINT_IR,
        "            return Call(node, \"unknown\", what, scope,\n",
        "            return None and Call(node, \"unknown\", what, scope,\n",
        (lint_case("cannot_tell.py"),),
    ),
    Mutant(
        "lint-rank0-helper-noted-not-checked", "the lint finds collectives only some ranks reach", LINT_IR,
        "            return Call(node, \"param\", func.id, scope)  # checked where it is passed (rules.py)",
        "            return Call(node, \"unknown\", func.id, scope, why=\"a parameter\")",
        (lint_case("rank0_helpers.py"),
         f"{T_LINT_SELF}::test_refddp_has_no_collective_that_only_some_ranks_reach"),
    ),
    Mutant(
        "lint-ddp-backward-missed", "the lint finds collectives only some ranks reach", LINT_IR,
        "        if method == \"backward\" and receiver.output:", "        if False:",
        (lint_case("wrapped_models.py"),),
    ),
    Mutant(
        "lint-launcher-variables-unknown", "the lint finds collectives only some ranks reach", LINT_VALUES,
        "    \"RANK\", \"LOCAL_RANK\", \"GROUP_RANK\", \"ROLE_RANK\", \"NODE_RANK\", \"SLURM_PROCID\",",
        "    \"GROUP_RANK\", \"ROLE_RANK\",",
        (lint_case("launcher_variables.py"), lint_case("module_globals.py")),
    ),
    Mutant(
        "lint-world-size-taken-for-a-rank", "the lint passes code every rank runs alike", LINT_VALUES,
        "RANK_FUNCTIONS = frozenset({\"torch.distributed.get_rank\", ",
        "RANK_FUNCTIONS = frozenset({\"torch.distributed.get_world_size\", \"torch.distributed.get_rank\", ",
        (lint_case("launcher_variables_fixed.py"), lint_case("symmetric_branches.py")),
    ),
    Mutant(
        "lint-text-taken-for-a-rank", "the lint passes code every rank runs alike", LINT_VALUES,
        "            if _is_text(node.left) or _is_text(node.right):", "            if False:",
        (lint_case("launcher_variables_fixed.py"),),
    ),
    Mutant(
        "lint-set-test-taken-for-a-rank", "the lint passes code every rank runs alike", LINT_VALUES,
        "            if self._is_set_test(node):", "            if False:",
        (lint_case("module_globals_fixed.py"), lint_case("launcher_variables_fixed.py")),
    ),
    Mutant(
        "lint-implicit-flow-ignored", "the lint finds collectives only some ranks reach", LINT_FLOW,
        "            facts = scope.facts(node.value).ranked(pc)",
        "            facts = scope.facts(node.value)",
        (lint_case("implicit_flow.py"),),
    ),
    Mutant(
        "lint-collective-output-stays-rank-dependent", "the lint passes code every rank runs alike", LINT_FLOW,
        "            return {**env, first.id: replace(env[first.id], rank=None, params=frozenset())}",
        "            return env",
        (lint_case("implicit_flow_fixed.py"),),
    ),
    Mutant(
        "lint-call-graph-ignored", "the lint finds collectives only some ranks reach", "refddp/lint/sequences.py",
        "        if call.kind != \"package\" or call.guess:", "        if True:",
        (lint_case("cross_file"), lint_case("module_globals.py")),
    ),
    Mutant(
        "lint-returns-not-followed", "the lint finds collectives only some ranks reach", "refddp/lint/scope.py",
        "            facts = self.package.returns.get(target, NOTHING)", "            facts = NOTHING",
        (lint_case("all_reduce_under_main_process.py"),),
    ),
    Mutant(
        "lint-attributes-not-followed", "the lint finds collectives only some ranks reach", "refddp/lint/scope.py",
        "        found = self.package.attribute(base.classes, name)", "        found = NOTHING",
        (lint_case("all_reduce_under_main_process.py"),),
    ),
    Mutant(
        "lint-properties-not-followed", "the lint finds collectives only some ranks reach", "refddp/lint/scope.py",
        "        for getter in self.package.properties(base.classes, name):",
        "        for getter in []:",
        (lint_case("rank_properties.py"),),
    ),
    Mutant(
        "lint-every-method-read-as-a-property", "the lint passes code every rank runs alike",
        "refddp/lint/calls.py", "        return self.cls is not None and any(",
        "        return self.cls is not None or any(",
        (lint_case("rank_properties_fixed.py"),),
    ),
    Mutant(
        "lint-subclass-properties-unseen", "the lint finds collectives only some ranks reach",
        "refddp/lint/calls.py", "            for member in self.family(cls):\n                getter =",
        "            for member in {cls}:\n                getter =",
        (lint_case("rank_properties.py"),),
    ),
    Mutant(
        "lint-setters-taken-for-getters", "the lint finds collectives only some ranks reach",
        "refddp/lint/calls.py", "                if accessor:  # a property's setter",
        "                if False:  # a property's setter",
        (lint_case("rank_properties.py"),),
    ),
    Mutant(
        "lint-point-to-point-noted", "the lint passes code every rank runs alike", "refddp/lint/collectives.py",
        "        if last in POINT_TO_POINT or last in NOT_COLLECTIVES:",
        "        if last in NOT_COLLECTIVES:",
        (lint_case("point_to_point.py"), lint_case("point_to_point_fixed.py")),
    ),
    Mutant(
        "lint-suppression-ignored", "a finding silenced on its line", "refddp/lint/findings.py",
        "    return codes is None or finding.code in {c.strip() for c in codes.split(\",\")}",
        "    return False",
        (lint_case("suppressed.py"), lint_case("cannot_tell_fixed.py")),
    ),
    Mutant(
        "lint-notes-fail-the-run", "the lint's exit status", "refddp/lint/__main__.py",
        "    counted = [f for f in findings if args.strict or not f.is_note]",
        "    counted = findings",
        (f"{T_LINT_CMD}::test_clean_code_and_notes_alone_exit_0_and_strict_counts_notes",),
    ),
    Mutant(
        "lint-scatter-output-taken-as-uniform", "the static lint", "refddp/lint/dataflow.py",
        "        if collective in OWN_PIECE_OUTPUT:", "        if False:", (f"{T_LINT}[pieces_and_progress_bars.py]",),
    ),
    Mutant(
        "lint-progress-bar-ternary-taken-for-a-rank-dependent-loop", "the static lint",
        "refddp/lint/rank_values.py",
        "                if over is not None and ast.dump(over) == ast.dump(plain):",
        "                if False:", (f"{T_LINT}[pieces_and_progress_bars_fixed.py]",),
    ),
    Mutant(
        "lint-progress-bar-assignment-taken-for-a-rank-dependent-loop", "the static lint",
        "refddp/lint/dataflow.py", "            if _rewraps(node, over):  # ``if rank == 0:",
        "            if False:  # ``if rank == 0:", (f"{T_LINT}[pieces_and_progress_bars_fixed.py]",),
    ),
    Mutant(
        "lint-math-drops-rank-dependence", "the static lint", "refddp/lint/rank_values.py",
        "        if dotted in ARITHMETIC:", "        if False:", (f"{T_LINT}[pieces_and_progress_bars.py]",),
    ),
    Mutant(
        "lint-hugging-face-flags-unknown", "the static lint", "refddp/lint/rank_values.py",
        '|main_rank|(world|local)_process_zero)"', '|main_rank)"', (f"{T_LINT}[pieces_and_progress_bars.py]",),
    ),
    Mutant(
        "lint-one-unreadable-file-ends-the-run", "the lint's exit status", "refddp/lint/sources.py",
        "            unreadable.append(str(exc))", "            raise", (f"{T_LINT_CMD}::test_each_file_that_does_not_parse_is_named_and_the_others_are_still_checked",),
    ),
    Mutant(
        "lint-byte-order-mark-refused", "the lint's exit status", "refddp/lint/sources.py",
        "        with tokenize.open(path) as source:",
        '        with open(path, encoding="utf-8") as source:', (f"{T_LINT_CMD}::test_each_file_that_does_not_parse_is_named_and_the_others_are_still_checked",),
    ),
    Mutant(
        "lint-deep-expression-a-traceback", "the lint's exit status", "refddp/lint/sources.py",
        "    except (RecursionError, MemoryError):", "    except MemoryError:", (f"{T_LINT_CMD}::test_each_file_that_does_not_parse_is_named_and_the_others_are_still_checked",),
    ),
    Mutant(
        "lint-else-note-says-the-condition-holds", "the static lint", "refddp/lint/rules.py",
        "                self.walk(node.b, here, negated)", "                self.walk(node.b, here, inner)",
        (f"{T_LINT_CMD}::test_a_note_in_the_else_branch_says_the_condition_is_false",),
    ),
    Mutant(
        "lint-global-statement-writes-unseen", "the static lint", "refddp/lint/dataflow.py",
        "            if target.id in self.global_names:", "            if False:",
        (f"{T_LINT}[module_globals_set_in_a_function.py]",),
    ),
    Mutant(
        "lint-progress-bar-over-another-loader-passes", "the static lint", "refddp/lint/dataflow.py",
        "    return (isinstance(over, ast.Name) and len(targets) == 1",
        "    return (over is not None or len(targets) == 1", (f"{T_LINT}[pieces_and_progress_bars.py]",),
    ),
    Mutant(
        "lint-nested-global-taken-for-the-functions", "the static lint", "refddp/lint/dataflow.py",
        "        elif not isinstance(node, NESTED_SCOPES):", "        else:",
        (f"{T_LINT}[module_globals_set_in_a_function_fixed.py]",),
    ),
    Mutant(
        "lint-rest-after-an-exit-said-to-run-where-it-leaves", "the static lint", "refddp/lint/rules.py",
        "                    ctx = Context(node.text, node.rank, negated=self._leaves_alone(node))",
        "                    ctx = Context(node.text, node.rank)",
        (f"{T_LINT_CMD}::test_a_note_after_an_early_return_says_where_the_rest_runs",),
    ),
    Mutant(
        "lint-bad-path-is-a-traceback", "the lint's exit status", "refddp/lint/__main__.py",
        "    except LintUsageError as exc:", "    except ZeroDivisionError as exc:",
        (f"{T_LINT_CMD}::test_a_bad_path_is_one_line_naming_it_and_exit_2",),
    ),
    Mutant(
        "eval-of-a-non-finite-checkpoint-exits-0", "no run that trains nothing exits 0", "refddp/train.py",
        '                judged = ("the evaluation", f"the evaluation of {r[\'checkpoint\']}", r)',
        "                judged = None",
        ("tests/training/test_skipped_steps.py::test_a_run_whose_final_evaluation_is_non_finite_says_so_and_exits_1",),
    ),
    Mutant(
        "resume-fallback-warned-by-every-rank", "bad input is one line", "refddp/checkpoints/loading.py",
        '    if os.environ.get(LAUNCHED_ENV) or rank != "0" or latest in _said:',
        "    if latest in _said:",
        ("tests/training/test_faults.py::test_corrupt_latest_checkpoint_falls_back_to_the_previous_one",),
    ),
    Mutant(
        "min-loss-scale-above-the-start-accepted", "bad input is one line", "refddp/config/schema.py",
        "        below=65536,\n", "        below=None,\n",
        ("tests/commands/test_bad_input.py::test_bad_flags",),
    ),
    Mutant(
        "history-writes-nan", "skips on the record", "refddp/training/trackers/jsonl.py",
        "    return json.dumps(_finite_or_none(value), indent=indent, allow_nan=False)",
        "    return json.dumps(value, indent=indent)",
        ("tests/training/test_skipped_steps.py::test_a_run_whose_final_evaluation_is_non_finite_says_so_and_exits_1",
         "tests/training/test_trackers.py::test_history_and_eval_json_write_non_finite_numbers_as_null"),
    ),
    Mutant(
        "lint-torchmetrics-compute-unseen", "the static lint", "refddp/lint/collectives.py",
        '    if library in ("torchmetrics", UNSYNCED_METRIC) and method in TORCHMETRICS_COLLECTIVES:',
        '    if False:',
        (lint_case("accelerate_and_lightning.py"),),
    ),
    Mutant(
        "lint-torchmetrics-objects-unknown", "the static lint", "refddp/lint/scope.py",
        "    for lib in (*COLLECTIVE_LIBRARIES, \"torchmetrics\"):", "    for lib in COLLECTIVE_LIBRARIES:",
        (lint_case("accelerate_and_lightning.py"),),
    ),
    Mutant(
        "lint-set-test-needs-the-environment", "the static lint", "refddp/lint/rank_values.py",
        '        if _named_like_a_rank(left) and not in_a_group and len(node.ops) == 1 and \\',
        '        if False and not in_a_group and len(node.ops) == 1 and \\',
        (lint_case("launcher_variables_fixed.py"),),
    ),
    Mutant(
        "lint-set-test-on-computed-values", "the static lint", "refddp/lint/rank_values.py",
        "    return isinstance(node, ast.Name | ast.Attribute) and name.lower() in RANK_NAMES - {",
        "    return True or name.lower() in RANK_NAMES - {",
        (lint_case("launcher_variables.py"),),
    ),
    Mutant(
        "lint-turns-guard-ignored", "the static lint", "refddp/lint/turns.py",
        "            if second is not None and second[0] == guard and second[1].complements(test) and (",
        "            if second is not None and second[1].complements(test) and (",
        (lint_case("rank_zero_goes_first.py"), T_LINT_TURNS,),
    ),
    Mutant(
        "lint-turns-rank-term-taken-for-a-guard", "the static lint", "refddp/lint/ir.py",
        '                guard = [t for t in test.values if not self.scope.facts(t).rank]',
        '                guard = [t for t in test.values if t is not test.values[-1]]',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-uniform-wrapper-ignored", "the static lint", "refddp/lint/turns.py",
        "            inner = self.turn(node.a[0]) if len(node.a) == 1 and not node.b else None",
        "            inner = None",
        (lint_case("rank_zero_goes_first_fixed.py"),),
    ),
    Mutant(
        "lint-turns-helper-halves-refused", "the static lint", "refddp/lint/turns.py",
        '                if node.kind != "collective" and (node.kind != "package" or node.guess or any(',
        '                if node.kind != "collective" and (True or node.guess or any(',
        (lint_case("rank_zero_goes_first_fixed.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-groups-ignored", "the static lint", "refddp/lint/turns.py",
        "        issued = tuple((a.key, tuple(s.group for s in a.sites)) for a in atoms)",
        "        issued = tuple((a.key, ()) for a in atoms)",
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-finally-not-read", "the static lint", "refddp/lint/turns.py",
        "                                           if isinstance(n, Try) and not n.handlers else [n])]",
        "                                           if False else [n])]",
        (lint_case("rank_zero_goes_first_fixed.py"),),
    ),
    Mutant(
        "lint-spawn-partial-not-unwrapped", "the static lint", "refddp/lint/calls.py",
        '                    function.module, fn.func) == "functools.partial":  # fmt: skip',
        '                    function.module, fn.func) == "no.such.partial":  # fmt: skip',
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "lint-spawn-partial-index-not-shifted", "the static lint", "refddp/lint/calls.py",
        "                index += len(fn.args) - 1",
        "                index += 0",
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "lint-spawn-bound-method-self-taken-for-the-index", "the static lint", "refddp/lint/calls.py",
        "            return (found[0], 1) if found else None",
        "            return (found[0], 0) if found else None",
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "lint-spawn-nested-def-unseen", "the static lint", "refddp/lint/calls.py",
        "                if fn.id in scope.nested:",
        "                if False:",
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "lint-spawn-lambda-index-lost", "the static lint", "refddp/lint/ir.py",
        "        return {p: given.get(p, NOTHING) | self.flow.entry.get(p, NOTHING)",
        "        return {p: given.get(p, NOTHING)",
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "lint-torchmetrics-unsynced-metric-flagged", "the static lint", "refddp/lint/scope.py",
        '                return Facts(library=UNSYNCED_METRIC)  # its compute() gathers nothing',
        '                return Facts(library=library)  # its compute() gathers nothing',
        (lint_case("accelerate_and_lightning_fixed.py"),),
    ),
    Mutant(
        "lint-torchmetrics-subclass-unseen", "the static lint", "refddp/lint/ir.py",
        '        if metric is not None and self._a_metric(metric):  # made unsynced, or as by default',
        "        if False:",
        (lint_case("accelerate_and_lightning.py"),),
    ),
    Mutant(
        "lint-turns-else-with-a-call-paired", "the static lint", "refddp/lint/turns.py",
        '        if not (node.a and self.communicates_only(node.a) and not any(every_call(node.b))):',
        '        if not (node.a and self.communicates_only(node.a)):',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-guard-parameter-dropped", "the static lint", "refddp/lint/turns.py",
        '        return [Branch(node.node, text, None, node.a, [], node.guard_params)]',
        '        return [Branch(node.node, text, None, node.a, [], frozenset())]',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-unseen-calls-between-dropped", "the static lint", "refddp/lint/turns.py",
        '        if not any(c.kind != "package" for c in every_call(nodes)):',
        '        if True:',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-rebinding-ignored", "the static lint", "refddp/lint/turns.py",
        '                    second[2] == issued) and not self.rebinds(nodes[i], nodes[j]):  # fmt: skip',
        '                    second[2] == issued):  # fmt: skip',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-computed-values-read-as-ranks", "the static lint", "refddp/lint/turns.py",
        '        found = rank_test(varying[0]) if len(varying) == 1 and _of_a_rank(varying[0]) else None',
        '        found = rank_test(varying[0]) if len(varying) == 1 else None',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-turns-helper-subgroups-ignored", "the static lint", "refddp/lint/turns.py",
        '                        self.subgroups(t, set()) for t in node.targets)):  # fmt: skip',
        '                        False for t in node.targets)):  # fmt: skip',
        (lint_case("rank_zero_goes_first.py"),),
    ),
    Mutant(
        "lint-set-test-in-a-group", "the static lint", "refddp/lint/rank_values.py",
        '        in_a_group = origin is not None and re.search(r"rank\\((?!\\))", origin.text)',
        '        in_a_group = False',
        (lint_case("launcher_variables.py"),),
    ),
    Mutant(
        "lint-unsynced-metric-sync-unseen", "the static lint", "refddp/lint/collectives.py",
        '    if library == UNSYNCED_METRIC and method == "compute":',
        '    if library == UNSYNCED_METRIC:',
        (lint_case("accelerate_and_lightning.py"),),
    ),
    Mutant(
        "lint-unsynced-subclass-flagged", "the static lint", "refddp/lint/scope.py",
        '                             library=UNSYNCED_METRIC if _unsynced(call) else None)',
        '                             library=None)',
        (lint_case("accelerate_and_lightning_fixed.py"),),
    ),
    Mutant(
        "lint-call-between-turns-said-to-run-where-a-condition-holds", "the static lint",
        LINT_RULES, "        if self.turns:\n            first, second = self.turns",
        "        if False:\n            first, second = self.turns",
        (f"{T_LINT_CMD}::test_a_call_between_two_turns_is_said_to_run_on_every_rank_at_two_places",),
    ),
    Mutant(
        "lint-turns-never-paired", "the static lint", "refddp/lint/turns.py",
        "            j = self.partner(nodes, i)", "            j = None",
        (lint_case("rank_zero_goes_first_fixed.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-paired-across-communicating-code", "the static lint", "refddp/lint/turns.py",
        "            if not self.quiet(nodes[j]):", "            if False:",
        (lint_case("rank_zero_goes_first.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-paired-across-a-package-call-that-communicates", "the static lint",
        "refddp/lint/turns.py",
        "            return node.kind != \"package\" or node.guess or not any(",
        "            return True or node.guess or not any(",
        (lint_case("rank_zero_goes_first.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-pair-any-two-tests-of-one-value", "the static lint", "refddp/lint/turns.py",
        "        return (self.subject, self.values) == (other.subject, other.values) and (",
        "        return self.subject == other.subject and (",
        (lint_case("rank_zero_goes_first.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-greater-than-misread", "the static lint", "refddp/lint/turns.py",
        "        return Test(subject, upto(k + 1), False)", "        return Test(subject, upto(k), False)",
        (lint_case("rank_zero_goes_first_fixed.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-turns-not-distributed-rank-kept", "the static lint", "refddp/lint/turns.py",
        "        values = frozenset(n for n in numbers if n is not None and n >= 0)",
        "        values = frozenset(n for n in numbers if n is not None)",
        (lint_case("rank_zero_goes_first_fixed.py"), T_LINT_TURNS),
    ),
    Mutant(
        "lint-spawned-worker-index-unseen", "the static lint", LINT_FLOW,
        "            elif self.package.spawned.get(function.qualname, (None, -1))[1] == i:",
        "            elif False:",
        (lint_case("spawn_worker.py"),),
    ),
    Mutant(
        "dist-lint-items-pass-whatever-the-findings", "pytest --dist-lint",
        "refddp/lint/pytest_items.py",
        "            mine = [f for f in findings if f.path == module.display]", "            mine = []",
        (f"{T_LINT_CMD}::test_dist_lint_adds_one_item_per_file_failing_with_its_findings",),
    ),
    Mutant(
        "flake8-plugin-reports-nothing", "the flake8 plugin", "refddp/lint/flake8.py",
        "            yield finding.line, finding.col, f\"{finding.code} {finding.message}\", type(self)",
        "            pass",
        (f"{T_LINT_CMD}::test_the_flake8_entry_point_names_the_plugin",),
    ),
    # Issue 47: the step's promises at their edges.
    Mutant(
        "skipped-step-keeps-the-buffers-changed", "a skipped step leaves no trace", STEPS,
        "ctx.world_size)\n    trainer.before_step.restore()\n", "ctx.world_size)\n",
        (f"{T_SKIPPED_STEPS}::test_a_skipped_step_leaves_the_model_optimizer_and_schedule_as_they_were[ddp]",
         f"{T_SKIPPED_STEPS}::test_a_batchnorm_run_on_exploding_data_ends_usable_with_its_skips_on_the_record"),
    ),
    Mutant(
        "buffer-snapshot-skips-counters", "a skipped step leaves no trace", SKIPPED,
        "            if not (buffer.is_floating_point() or buffer.numel() <= SMALL_BUFFER):",
        "            if not buffer.is_floating_point():",
        (f"{T_SKIPPED_STEPS}::test_a_skipped_step_leaves_the_model_optimizer_and_schedule_as_they_were[ddp]",),
    ),
    Mutant(
        "buffer-snapshot-skips-small-integer-buffers", "a skipped step leaves no trace", SKIPPED,
        "            if not (buffer.is_floating_point() or buffer.numel() <= SMALL_BUFFER):",
        "            if not (buffer.is_floating_point() or buffer.numel() == 1):",
        ("tests/training/test_skips.py::test_a_snapshot_puts_back_small_integer_buffers_and_leaves_large"
         "_constants_uncopied",),
    ),
    Mutant(
        "schedule-advances-on-a-skipped-step", "a skipped step leaves no trace", STEPS,
        "        skip_step(trainer, step, step_loss, norm)\n        return False\n",
        "        skip_step(trainer, step, step_loss, norm)\n        trainer.schedule.scheduler.step()\n"
        "        return False\n",
        (f"{T_SKIPPED_STEPS}::test_a_skipped_step_leaves_the_model_optimizer_and_schedule_as_they_were[ddp]",),
    ),
    Mutant(
        "resumed-schedule-counts-skipped-steps", "skips continue across a resume", RUN_STATE,
        "_apply_hyperparameters(parts, c, step - skipped)",
        "_apply_hyperparameters(parts, c, step)",
        (f"{T_SKIPPED_STEPS}::test_skips_continue_across_a_resume_and_reach_the_trackers",),
    ),
    Mutant(
        "skip-count-not-checkpointed", "skips continue across a resume", RUN_STATE,
        '        "skipped_steps": pos.skipped_steps,\n', "",
        (f"{T_SKIPPED_STEPS}::test_skips_continue_across_a_resume_and_reach_the_trackers",),
    ),
    Mutant(
        "skips-not-in-history", "skips on the record", "refddp/training/trackers/jsonl.py",
        '        self.record({"step": step, "skipped": cause, "skipped_steps": total})',
        "        pass",
        (f"{T_SKIPPED_STEPS}::test_a_batchnorm_run_on_exploding_data_ends_usable_with_its_skips_on_the_record",),
    ),
    Mutant(
        "min-loss-scale-ignored", "no run that trains nothing exits 0", SKIPPED,
        "if overflow is not None and overflow[1] < c.min_loss_scale:", "if False:",
        (f"{T_SKIPPED_STEPS}::test_an_fp16_run_whose_gradient_is_nan_at_every_scale_ends_in_one_line_exit_1[skip]",),
    ),
    Mutant(
        "consecutive-skips-unlimited", "no run that trains nothing exits 0", SKIPPED,
        "if c.max_consecutive_skips and in_a_row >= c.max_consecutive_skips:", "if False:",
        (f"{T_SKIPPED_STEPS}::test_a_run_that_skips_every_step_ends_at_the_consecutive_limit_in_one_line_exit_1",),
    ),
    Mutant(
        "failed-run-trackers-left-open", "a failed run's trackers close, marked failed", TRAINER,
        "                self.trackers.close_failed()  # what was logged stays; W&B marks the run "
        "failed\n",
        "                self.trackers.flush()\n",
        (f"{T_FAILED_RUN}[skips]",), needs="tensorboard, wandb",
    ),
    Mutant(
        "failed-wandb-run-finished-as-done", "a failed run's trackers close, marked failed",
        "refddp/training/trackers/wandb.py",
        "        self.wandb_run.finish(exit_code=1)\n", "        self.wandb_run.finish()\n",
        (f"{T_FAILED_RUN}[skips]",), needs="tensorboard, wandb",
    ),
    Mutant(
        "failed-tracker-left-holding-its-points", "a failed run's trackers close, marked failed",
        "refddp/training/trackers/base.py",
        "        default, as ``close``.\"\"\"\n        self.close()\n",
        "        default, as ``close``.\"\"\"\n",
        (f"{T_FAILED_RUN}[skips]",), needs="tensorboard, wandb",
    ),
    Mutant(
        "nonfinite-final-evaluation-closed-as-done", "a failed run's trackers close, marked failed",
        TRAINER, "        if not stopping and not finite_validation(pos.metrics):\n",
        "        if False:\n", (f"{T_FAILED_RUN}[final-evaluation]",), needs="tensorboard, wandb",
    ),
    Mutant(
        "tracker-failing-at-the-end-leaves-the-rest-open",
        "a failed run's trackers close, marked failed", "refddp/training/trackers/base.py",
        "                tracker.close()\n            except BaseException:\n                "
        "self.close_failed()\n",
        "                tracker.close()\n            except BaseException:\n                "
        "self.opened = []\n",
        (f"{T_TRACKER_UNITS}::test_a_tracker_failing_as_the_run_ends_fails_it_and_the_others_close_as_failed",),
    ),
    Mutant(
        "tracker-failing-to-open-leaves-the-others-open",
        "a failed run's trackers close, marked failed", "refddp/training/trackers/base.py",
        "            cls(opened).close_failed()  # the run fails here: those opened close as failed\n",
        "            pass\n",
        (f"{T_TRACKER_UNITS}::test_a_tracker_failing_to_open_closes_those_opened_as_failed",),
    ),
    Mutant(
        "trackers-closed-before-every-flush", "a failed run's trackers close, marked failed",
        "refddp/training/trackers/base.py",
        "        self.flush()\n        if self._failed is not None:\n",
        "        if self._failed is not None:\n",
        (f"{T_TRACKER_UNITS}::test_a_tracker_failing_as_the_run_ends_fails_it_and_the_others_close_as_failed",),
    ),
    Mutant(
        "tracker-error-raised-over-the-runs", "a failed run's trackers close, marked failed",
        "refddp/training/trackers/base.py",
        "            except Exception as exc:\n                log.warning(\"log_to: %s did not close",
        "            except ZeroDivisionError as exc:\n                log.warning(\"log_to: %s did not close",
        (f"{T_TRACKER_UNITS}::test_a_failed_run_closes_every_tracker_as_failed_and_raises_none_of_theirs",),
    ),
    Mutant(
        "whole-run-skipped-exits-0", "no run that trains nothing exits 0", SKIPPED,
        "    if not step or in_a_row < step:\n", "    if True:\n",
        (f"{T_SKIPPED_STEPS}::test_a_run_shorter_than_the_limit_that_skips_every_step_ends_in_one_line_exit_1",
         f"{T_SKIPPED_STEPS}::test_a_run_ends_in_failure_exactly_when_a_streak_reaches_the_limit_or_nothing_trained",
         f"{T_SCENARIOS}::test_every_generated_scenario_keeps_the_ranks_in_step_and_leaves_skips_no_trace"),
    ),
    Mutant(
        "any-run-ending-in-a-skip-fails", "no run that trains nothing exits 0", SKIPPED,
        "    if not step or in_a_row < step:\n", "    if not step or not in_a_row:\n",
        (f"{T_SKIPPED_STEPS}::test_a_run_that_trained_before_its_last_steps_were_skipped_ends_exit_0",
         f"{T_SKIPPED_STEPS}::test_a_run_ends_in_failure_exactly_when_a_streak_reaches_the_limit_or_nothing_trained"),
    ),
    Mutant(
        "skip-streak-not-checkpointed", "no run that trains nothing exits 0", RUN_STATE,
        '        "skipped_in_a_row": pos.skipped_in_a_row,\n', "",
        (f"{T_SKIPPED_STEPS}::test_a_resumed_run_that_skipped_every_step_before_and_after_the_stop_ends_exit_1",),
    ),
    Mutant(
        "skips-in-a-row-never-reset", "no run that trains nothing exits 0", STEPS,
        "    trainer.pos.skipped_in_a_row = 0\n", "",
        (f"{T_SKIPPED_STEPS}::test_the_consecutive_limit_counts_skips_in_a_row_only",),
    ),
    Mutant(
        "nonfinite-final-evaluation-exits-0", "no run that trains nothing exits 0",
        "refddp/train.py",
        "            if judged is not None and not finite_validation(judged[2]):",
        "            if False:",
        (f"{T_SKIPPED_STEPS}::test_a_run_whose_final_evaluation_is_non_finite_says_so_and_exits_1",),
    ),
    Mutant(
        "ignored-parameters-decide-alone", "no rank can branch alone", PARALLEL,
        "        if self.unreduced:\n            norm = self.agreed_norm(parameters)",
        "        if False:\n            norm = self.agreed_norm(parameters)",
        (f"{T_SKIPPED_STEPS}::test_a_nan_gradient_on_a_parameter_ddp_ignores_is_skipped_on_every_rank[2]",),
    ),
    Mutant(
        "fp16-with-ignored-parameters-allowed", "no rank can branch alone", PARALLEL,
        'if self.unreduced and c.amp == "fp16":', "if False:",
        (f"{T_SKIPPED_STEPS}::test_fp16_with_a_parameter_ddp_ignores_is_refused_in_one_line",),
    ),
    Mutant(
        "fp16-with-ignored-parameters-refused-on-rank-0-only", "no rank can branch alone", PARALLEL,
        'if self.unreduced and c.amp == "fp16":', 'if self.unreduced and c.amp == "fp16" and ctx.rank == 0:',
        (f"{T_SKIPPED_STEPS}::test_fp16_with_a_parameter_ddp_ignores_is_refused_in_one_line",),
    ),
    Mutant(
        "first-step-keeps-ddps-first-layout", "bit-exact resume at any world size", PARALLEL,
        "self.first_backward_rebuilds = ctx.world_size > 2 and not c.find_unused_parameters",
        "self.first_backward_rebuilds = False",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical[ddp-4]",),
    ),
    Mutant(
        "bucket-settle-leaves-buffers-changed", "bit-exact resume at any world size", STEPS,
        "    trainer.before_step.restore()\n    trainer.bucket_layout_pending = False\n",
        "    trainer.bucket_layout_pending = False\n",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical[ddp-3-convnet]",),
    ),
    Mutant(
        "buffer-snapshot-keeps-the-first-tensor", "a skipped step leaves no trace", SKIPPED,
        "            buffer = getattr(module, name)\n            if buffer is None",
        "            buffer = self.__dict__.setdefault(f\"{id(module)}{name}\", getattr(module, name))\n"
        "            if buffer is None",
        ("tests/training/test_skips.py::test_a_snapshot_puts_back_buffers_updated_in_place_and_assigned_anew",),
    ),
    Mutant(
        "fp16-norm-overflow-taken-for-backoff", "a non-finite loss is no fp16 overflow", SKIPPED,
        "    scaler.load_state_dict(kept)\n    return None", "    return None",
        ("tests/training/test_skips.py::test_finite_gradients_whose_norm_overflowed_change_nothing",),
    ),
    Mutant(
        "bucket-settle-draws-dropout-masks", "bit-exact resume at any world size", STEPS,
        "    with torch.random.fork_rng(devices=[] if on_host else [trainer.device],\n"
        "                               device_type=\"cuda\" if on_host else trainer.device.type):",
        "    with contextlib.nullcontext():",
        (f"{T_TRAINER}::test_exact_resume_in_process_is_bit_identical[ddp-3-convnet]",),
    ),
    Mutant(
        "fsdp-batchnorm-cast-to-bf16", "FSDP trains BatchNorm models under bf16", PARALLEL,
        "kept_in_float32 = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]",
        "kept_in_float32 = []",
        (f"{T_SKIPPED_STEPS}::test_a_skipped_step_leaves_the_model_optimizer_and_schedule_as_they_were[fsdp-bf16]",),
    ),
    Mutant(
        "fp16-step-reads-gradscalers-check", "one device-to-host read a step", STEPS,
        "        trainer.optimizer.step()\n        if trainer.scaling:",
        "        trainer.scaler.step(trainer.optimizer) if trainer.scaling else trainer.optimizer.step()\n"
        "        if trainer.scaling:",
        (f"{T_SKIPPED_STEPS}::test_a_step_reads_from_the_device_once[fp16]",),
    ),
    # The next step's batches fetched while the device finishes the backward.
    Mutant(
        "batches-not-fetched-ahead", "the next step's batches are fetched before the read",
        STEPS, "    fetch_next_step(trainer, batches)  # while the device (or gloo) finishes the backward\n",
        "",
        (f"{T_SKIPPED_STEPS}::test_the_next_steps_batches_are_fetched_before_a_step_waits_for_the"
         "_device",),
    ),
    Mutant(
        "batches-fetched-before-an-evaluation", "the next step's batches are fetched before the read",
        STEPS, "    if trainer.evaluates_after(this_step):",
        "    if this_step % trainer.sampler.steps_per_epoch == 0 or this_step >= trainer.total_steps:",
        (f"{T_SKIPPED_STEPS}::test_the_next_steps_batches_are_fetched_before_a_step_waits_for_the"
         "_device",),
    ),
    Mutant(
        "host-rngs-moved-by-the-fetch-ahead", "the next step's batches are fetched before the read",
        STEPS, "            host_random.set_states(before)\n", "",
        (f"{T_SKIPPED_STEPS}::test_an_exact_resume_after_a_batch_fetched_ahead_with_pythons_and"
         "_numpys_rngs",),
    ),
    Mutant(
        "throttle-period-unchecked", "a throttle that could not run is refused", CLUSTER,
        "    why = seconds_error(period_s)", '    why = "not positive" if period_s <= 0 else ""',
        ("tests/harness/test_cluster_checks.py",
         f"{T_CLUSTER}::test_a_throttle_that_could_not_run_is_refused_with_one_line"),
    ),
    Mutant(
        "throttle-share-unchecked", "a throttle that could not run is refused", CLUSTER,
        "    if not (isinstance(share, numbers.Real) and 0 < share < 1):",
        "    if not share < 1:",
        ("tests/harness/test_cluster_checks.py",
         f"{T_CLUSTER}::test_a_throttle_that_could_not_run_is_refused_with_one_line"),
    ),
    Mutant(
        "host-rngs-unseeded-at-start", "a fresh run's in-process draws are reproducible",
        "refddp/train.py", "        host_random.seed(c.seed + ctx.rank)", "        pass",
        (f"{T_MODELS}::test_a_dataset_drawing_from_python_and_numpy_in_the_process_trains_alike"
         "_in_every_fresh_run",),
    ),
    Mutant(
        "host-rngs-seeded-alike-on-every-rank", "a fresh run's in-process draws are reproducible",
        "refddp/train.py", "        host_random.seed(c.seed + ctx.rank)",
        "        host_random.seed(c.seed)",
        (f"{T_MODELS}::test_each_rank_draws_its_own_python_and_numpy_streams_the_same_in_every"
         "_fresh_run",),
    ),
    Mutant(
        "fetch-error-raised-early", "the next step's batches are fetched before the read", STEPS,
        "        except Exception as error:  # noqa: BLE001 (re-raised by __next__, in order)",
        "        except StopIteration as error:",
        (f"{T_SKIPPED_STEPS}::test_a_batch_that_fails_to_load_fails_its_own_step_not_the_step_that"
         "_fetched_it",),
    ),
    Mutant(
        "gradient-freed-at-the-update", "a step's gradient is freed before the next forward",
        STEPS,
        "            trainer.scaler.update()  # GradScaler's growth count\n    if not applied:\n",
        "            trainer.scaler.update()  # GradScaler's growth count\n"
        "    trainer.optimizer.zero_grad(set_to_none=True)\n    if not applied:\n",
        (f"{T_SKIPPED_STEPS}::test_an_applied_steps_gradient_lives_until_the_next_steps_forward",),
    ),
    Mutant(
        "gradient-accumulates-across-steps", "a step's gradient is freed before the next forward",
        STEPS, "    free_last_gradient(trainer)\n    step_loss = None\n", "    step_loss = None\n",
        (f"{T_SKIPPED_STEPS}::test_an_applied_steps_gradient_lives_until_the_next_steps_forward",),
    ),
    Mutant(
        "gradient-freed-after-the-step", "a step's gradient is freed before the next forward",
        TRAINER, "            stopping = self.end_of_step(signum, steps_this_run)\n",
        "            stopping = self.end_of_step(signum, steps_this_run)\n"
        "            self.optimizer.zero_grad(set_to_none=True)\n",
        (f"{T_SKIPPED_STEPS}::test_an_applied_steps_gradient_lives_until_the_next_steps_forward",),
    ),
    Mutant(
        "skipped-steps-gradient-kept", "a step's gradient is freed before the next forward", STEPS,
        "    free_last_gradient(trainer)  # its non-finite gradient goes now, not at the next step\n",
        "",
        (f"{T_SKIPPED_STEPS}::test_an_applied_steps_gradient_lives_until_the_next_steps_forward",),
    ),
    Mutant(
        "gradient-kept-after-fit", "a step's gradient is freed before the next forward", TRAINER,
        "                steps.free_last_gradient(self)  # the model is handed back without one\n",
        "                pass\n",
        (f"{T_SKIPPED_STEPS}::test_an_applied_steps_gradient_lives_until_the_next_steps_forward",),
    ),
    Mutant(
        "watchdog-marks-after-the-read", "a hang report shows every rank's stack", STEPS,
        "        trainer.watchdog.progress()\n"
        "    fetch_next_step(trainer, batches)  # while the device (or gloo) finishes the backward\n"
        "    agreed = trainer.agreement.read(norm)  # one host read a step: the norm and the agreement\n",
        "        pass\n"
        "    fetch_next_step(trainer, batches)  # while the device (or gloo) finishes the backward\n"
        "    agreed = trainer.agreement.read(norm)  # one host read a step: the norm and the agreement\n"
        "    if trainer.watchdog:\n        trainer.watchdog.progress()\n",
        (f"{T_SKIPPED_STEPS}::test_the_next_steps_batches_are_fetched_before_a_step_waits_for_the"
         "_device", "tests/training/test_faults.py::test_hung_data_loader_writes_every_rank_stack"
         "_and_fails"),
    ),
    # torch 2.5's destroy_process_group, skipped where the process exits next.
    Mutant(
        "end-process-unmarked", "a finished run exits 0: no exit deadlock",
        "refddp/launch/exits.py",
        "    ends_unfinalized()  # teardown may leave a group that can hang (torch < 2.8) to the exit\n",
        "",
        ("tests/launch/test_end_process.py::test_end_process_marks_its_process_as_one_that_exits"
         "_unfinalized",),
    ),
    Mutant(
        "group-left-on-torch-2-5", "a finished run exits 0: no exit deadlock", DIST,
        "        if owned and dist.is_initialized() and not (_ends_unfinalized and destroy_can_hang()):",
        "        if owned and dist.is_initialized():",
        ("tests/launch/test_end_process.py::test_a_process_about_to_exit_leaves_the_group_except"
         "_before_torch_2_8",),
    ),
    Mutant(
        "group-kept-on-every-torch", "a finished run exits 0: no exit deadlock", DIST,
        "    return torch_version() < (2, 8) and \"gloo\" in str(dist.get_backend())",
        "    return True",
        ("tests/launch/test_end_process.py::test_a_process_about_to_exit_leaves_the_group_except"
         "_before_torch_2_8",),
    ),
    # Issue 51: a hang's stacks, always.
    Mutant(
        "stack-signal-is-sigusr1", "a hang report shows every rank's stack", PROTOCOL,
        'STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2',
        "STACK_SIGNAL = signal.SIGUSR1",
        (f"{T_STACKS}::test_a_rank_inside_the_trainers_stop_handlers_shows_its_stack",),
    ),
    Mutant(
        "stack-signal-not-rearmed", "a hang report shows every rank's stack", WORKER,
        "        arm_stack_dumps(stack_file)  # (the task may have taken the signal for itself)\n",
        "",
        (f"{T_STACKS}::test_a_task_that_took_the_stack_signal_leaves_the_next_hang_its_stacks",),
    ),
    Mutant(
        "no-stack-says-nothing-of-why", "a hang report shows every rank's stack", REPORTS,
        'text = text or f"(no stack: {why_no_stack(pids[r])})"',
        'text = text or "(no stack could be read)"',
        (f"{T_STACKS}::test_a_rank_ignoring_the_stack_signal_is_reported_saying_why",),
    ),
    Mutant(
        "heavy-tests-not-grouped", "no two heavy tests share the machine", "conftest.py",
        '            item.add_marker(pytest.mark.xdist_group("heavy"))', "            pass",
        ("tests/project/test_suite_tiers.py::test_heavy_tests_share_one_xdist_group",),
    ),
    # Issue 48: another backend for real, PyTorch's suites unmodified.
    Mutant(
        "another-backend-joins-the-pools-group", "another backend started for real", UNITTEST,
        "            self.real_destroy()\n        self.start(backend, *args, **kwargs)\n",
        "            self.real_destroy()\n",
        ("tests/harness/test_harness_parity.py::test_another_backend_starts_for_real_and_the_pools_group_comes_back",),
    ),
    Mutant(
        "pools-group-not-rejoined", "another backend started for real", UNITTEST,
        "        self.context._rejoin_pool_group()", "        pass",
        ("tests/harness/test_harness_parity.py::test_another_backend_starts_for_real_and_the_pools_group_comes_back",),
    ),
    Mutant(
        "detail-wrapper-around-a-tests-group", "another backend started for real", UNITTEST,
        "        if detail:\n            dist.set_debug_level(dist.DebugLevel.INFO)",
        "        if False:\n            dist.set_debug_level(dist.DebugLevel.INFO)",
        ("tests/harness/test_harness_parity.py::test_another_backend_starts_for_real_and_the_pools_group_comes_back",),
        equivalent="wherever the debug level is DETAIL the pool has replaced torch's wrapper factory "
        "(`fingerprint.replace_torchs_group_check`), so the test's group is unwrapped at either "
        "level (run on torch 2.13); the lower level keeps it so on a torch that renames that "
        "private factory and still wraps",
    ),
    Mutant(
        "rank-read-from-the-current-group", "another backend started for real", UNITTEST,
        "        if here is not None:\n            return here.rank\n", "",
        ("tests/harness/test_harness_parity.py::test_another_backend_starts_for_real_and_the_pools_group_comes_back",),
    ),
    Mutant(
        "torch-suites-base-not-swapped", "PyTorch's suites unmodified on warm pools",
        "refddp/testing/torch_suites.py",
        "        common_distributed.MultiProcessTestCase = pooled_test_case()", "        pass",
        ("tests/harness/test_torch_suites.py::test_unmodified_multiprocesstestcase_and_dtensor_suites_run_on_warm_pools",),
    ),
    Mutant(
        "ranks-keep-torchs-base", "PyTorch's suites unmodified on warm pools",
        "refddp/testing/torch_suites.py", "        rank_setup = (SWAP,)", "        rank_setup = ()",
        ("tests/harness/test_torch_suites.py::test_unmodified_multiprocesstestcase_and_dtensor_suites_run_on_warm_pools",),
    ),
    Mutant(
        "torch-rng-unseeded-at-another-world-size", "a resume at another world size seeds each rank",
        "refddp/checkpoints/run_state.py", "        torch.manual_seed(fresh)\n", "",
        (f"{T_TRAINER}::test_a_resume_at_another_world_size_gives_each_rank_its_own_streams_the"
         "_same_every_time",),
    ),
    Mutant(
        "host-rngs-unseeded-at-another-world-size", "a resume at another world size seeds each rank",
        "refddp/checkpoints/run_state.py",
        "        host_random.seed(fresh)  # Python's and numpy's too, as at a run's start",
        "        pass",
        (f"{T_TRAINER}::test_a_resume_at_another_world_size_gives_each_rank_its_own_streams_the"
         "_same_every_time",),
    ),
    Mutant(
        "streams-alike-on-every-rank-at-another-world-size",
        "a resume at another world size seeds each rank", "refddp/checkpoints/run_state.py",
        "        fresh = c.seed + 7919 * step + rank", "        fresh = c.seed + 7919 * step",
        (f"{T_TRAINER}::test_a_resume_at_another_world_size_gives_each_rank_its_own_streams_the"
         "_same_every_time",),
    ),
    Mutant(
        "streams-alike-at-every-step-at-another-world-size",
        "a resume at another world size seeds each rank", "refddp/checkpoints/run_state.py",
        "        fresh = c.seed + 7919 * step + rank", "        fresh = c.seed + rank",
        (f"{T_TRAINER}::test_a_resume_at_another_world_size_gives_each_rank_its_own_streams_the"
         "_same_every_time",),
    ),
    Mutant(
        "outer-session-lost-after-an-inner-one", "an inner pytest session leaves the outer's options",
        "refddp/testing/plugin.py",
        "        session_config = config.stash.get(_OUTER_SESSION, None)",
        "        session_config = None",
        ("tests/harness/test_plugin.py::test_a_pytest_session_run_inside_another_leaves_the_outer"
         "_ones_options",),
    ),
    Mutant(
        "outer-preload-lost-after-an-inner-one", "an inner pytest session leaves the outer's options",
        "refddp/testing/plugin.py",
        "        rank_server.preload[:] = config.stash[_OUTER_PRELOAD]", "        pass",
        ("tests/harness/test_plugin.py::test_a_pytest_session_run_inside_another_leaves_the_outer"
         "_ones_options",),
    ),
    Mutant(
        "interrupted-task-leaves-its-pool-running-it", "an interrupted task stops its pool",
        TASKS,
        "        if not isinstance(interruption, _PoolGone):\n            _interrupted(pool, interruption, offsets)\n",
        "        pass\n",
        (f"{T_HARNESS}::test_a_task_interrupted_in_the_driver_stops_its_pool_not_the_next_task",),
    ),
    Mutant(
        "interrupted-task-leaves-no-rank-stacks", "an interrupted task stops its pool",
        TASKS,
        "            print(pool.files.report(headline, {}, stacks, offsets), file=sys.stderr, flush=True)",
        "            pass",
        (f"{T_HARNESS}::test_a_task_interrupted_in_the_driver_stops_its_pool_not_the_next_task",),
    ),
    Mutant(
        "server-request-cut-short-keeps-the-server", "an interrupted task stops its pool",
        "refddp/testing/driver/rank_server.py",
        "            self.proc.kill()\n            self.proc.wait()\n            self.sock.close()\n            raise\n",
        "            raise\n",
        ("tests/harness/test_rank_server.py::test_a_request_to_the_server_cut_short_gives_that_server_up",),
    ),
    Mutant(
        "dotted-test-module-looked-up-through-its-package", "the ranks find a test module under every import mode",
        "refddp/testing/rank/worker.py",
        "        loaded = sys.modules.get(module)\n", "        loaded = None\n",
        ("tests/harness/test_plugin.py::test_importlib_mode_run_from_outside_the_rootdir[plain]",),
    ),
    Mutant(
        "ranks-import-from-the-directory-pytest-started-in", "the ranks find a test module under every import mode",
        "refddp/testing/rank/worker.py",
        '    started_in = ("", os.getcwd())', "    started_in = ()",
        ("tests/harness/test_plugin.py::test_importlib_mode_run_from_outside_the_rootdir"
         "[a-same-named-module-in-cwd]",),
    ),
    Mutant(
        "world-size-in-a-param-ignored", "a world_size mark that would be ignored fails its test",
        "refddp/testing/plugin.py", "    if in_params:\n", "    if False:\n",
        ("tests/harness/test_plugin_rank_fixtures.py::test_a_world_size_mark_that_would_be_ignored"
         "_fails_that_test_in_one_line",),
    ),
    Mutant(
        "stacked-world-size-marks-ignored", "a world_size mark that would be ignored fails its test",
        "refddp/testing/plugin.py", "    if len(on_function) > 1:\n", "    if False:\n",
        ("tests/harness/test_plugin_rank_fixtures.py::test_a_world_size_mark_that_would_be_ignored"
         "_fails_that_test_in_one_line",),
    ),
    Mutant(
        "fault-exit-code-past-255-taken", "a bad fault is a one-line error",
        FAULTS, "and 0 <= code <= 255):", "):",
        (f"{T_FAULTS}::test_bad_faults_are_one_line_errors",),
    ),
    Mutant(
        "a-second-fault-left-unnamed", "the report says which fault fired where",
        REPORTS, '        own = "".join(f" (injected: {line})" for line in fired.get(rank, ())\n',
        '        own = "".join(f"" for line in ()\n',
        (f"{T_FAULTS}::test_several_faults_that_fire_are_each_named_with_the_rank_they_ended",),
    ),
    Mutant(
        "resume-at-a-lowered-end-not-evaluated", "a resume at a lowered end evaluates there",
        TRAINER, "                      and pos.metrics.get(\"step\") != pos.step)",
        "                      and False)",
        (T_LOWERED_END,),
    ),
    Mutant(
        "finished-run-evaluated-again-on-rerun", "a resume at a lowered end evaluates there",
        TRAINER, "                      and pos.metrics.get(\"step\") != pos.step)",
        "                      )",
        (T_LOWERED_END,),
    ),
    Mutant(
        "resume-past-its-end-taken", "a resume at a lowered end evaluates there",
        RUN_STATE, "    if step <= total_steps:\n        return\n", "    if True:\n        return\n",
        (T_LOWERED_END,),
    ),
    Mutant(
        "ranks-the-agent-ended-named-as-causes", "a failed rank is named in one line",
        "refddp/launch/torchrun.py", "for rank, failure in causes or failures)",
        "for rank, failure in failures)",
        ("tests/launch/test_exit_codes.py::test_a_sigkilled_rank_is_named_and_no_empty_stack_file_is_reported",),
    ),
    Mutant(
        "blocked-callable-taken-for-a-corrupt-file", "a checkpoint needing pickled code is refused, naming it",
        CKPT_FULL, "(?:was not an allowed global|whose module \\S+ is blocked)",
        "was not an allowed global",
        ("tests/checkpoints/test_checkpoint.py::test_checkpoint_needing_pickled_code_is_refused",),
    ),
    Mutant(
        "second-config-file-replaces-the-first", "bad input is one line",
        "refddp/config/command_line.py", "    if len(files) > 1:", "    if False:",
        ("tests/commands/test_bad_input.py::test_a_config_file_given_twice_is_refused_in_one_line",),
    ),
    Mutant(
        "predict-with-resume-never-told-no-checkpoint", "bad input is one line",
        CKPT, '    if found is None and c.task != "train" and c.resume == "never":',
        '    if False:',
        ("tests/commands/test_bad_input.py::test_predict_with_resume_never_says_resume_rules_the_checkpoint_out",),
    ),
    Mutant(
        "run-directory-not-held", "a second run on a run directory in use is refused",
        "refddp/train.py", "        _held.append(hold_run_directory(c.out))", "        pass",
        ("tests/checkpoints/test_resume.py::test_a_second_run_on_a_run_directory_in_use_is_refused_and_the"
         "_first_goes_on",),
    ),
    Mutant(
        "unused-parameters-left-to-ddps-traceback", "bad input is one line",
        TRAINER, "unused = unused_parameters_line(exc, getattr(self.parallel, \"wrapped\", self.model))",
        "unused = None",
        ("tests/launch/test_exit_codes.py::test_parameters_without_a_gradient_are_one_line_naming_them_and"
         "_the_flag",),
    ),
    Mutant(
        "unpicklable-dataset-traceback-under-an-explicit-start", "bad input is one line",
        DATA, '    loader = LoaderFallback if c.worker_start == "auto" else StartLoader',
        '    loader = LoaderFallback if c.worker_start == "auto" else DataLoader', (T_EXPLICIT_START,),
    ),
    Mutant(
        "torchs-pickle-warning-beside-the-line", "bad input is one line",
        DATA, '        warnings.filterwarnings("ignore", "Got pickle error", UserWarning)',
        "        pass", (T_EXPLICIT_START,),
    ),
    Mutant(
        "tensor-file-ignored-labels-refused", "a .pt data file is checked as the user wrote it",
        DATA, "    labels = y[y != IGNORE_INDEX]", "    labels = y",
        ("tests/workload/test_data.py::test_tensor_file_labels_may_be_the_ignored_index",),
    ),
    Mutant(
        "tensor-file-checked-after-its-split", "a .pt data file is checked as the user wrote it",
        DATA, '''        x, y = _checked_pair(blob, "x", "y", path, c)
        n_val = max(1, len(x) // 10)
        train, val = (x[:-n_val], y[:-n_val]), (x[-n_val:], y[-n_val:])''',
        '''        x, y = blob["x"], blob["y"]
        n_val = max(1, len(x) // 10)
        train = _checked_pair({"x": x[:-n_val], "y": y[:-n_val]}, "x", "y", path, c)
        val = _checked_pair({"x": x[-n_val:], "y": y[-n_val:]}, "x", "y", path, c)''',
        ("tests/commands/test_bad_input.py::test_data_file_with_wrong_shapes",),
    ),
    Mutant(
        "converter-output-under-a-file-called-missing", "the converter's bad input is one line",
        "refddp/convert_checkpoint.py", "        if os.path.isfile(above):", "        if False:",
        (f"{T_CONVERT}::test_bad_input_is_one_line_naming_the_path_exit_2",),
    ),
    Mutant(
        "leading-unlabelled-samples-refused", "bad input is one line",
        "refddp/workload/objectives/__init__.py",
        "            except NoTargets:  # leading unlabelled samples, say: look across the dataset",
        "            except ZeroDivisionError:",
        ("tests/workload/test_objectives.py::test_a_dataset_whose_first_samples_are_unlabelled_is_checked"
         "_on_samples_across_it",),
    ),
    Mutant(
        "final-evaluation-failed-on-any-metric", "no run that trains nothing exits 0",
        EVALUATION, '    loss = metrics.get("val_loss")\n    return not isinstance(loss, float) or math.isfinite(loss)',
        """    return all(math.isfinite(v) for k, v in metrics.items()
               if k.startswith("val_") and isinstance(v, float))""",
        ("tests/training/test_skips.py::test_a_final_evaluation_fails_on_its_loss_not_on_a_metric_made"
         "_infinite",),
    ),
    Mutant(
        "fresh-run-keeps-earlier-checkpoints", "a fresh run takes none of an earlier run's checkpoints",
        TRAINER, "        fresh, self.saves_fresh = self.saves_fresh, False",
        "        fresh, self.saves_fresh = False, False", (T_FRESH_RUN,),
    ),
    Mutant(
        "fresh-run-removes-its-init-from-source", "a fresh run takes none of an earlier run's checkpoints",
        TRAINER, "        if self.saves_fresh and c.init_from and run_files.is_within(c.init_from,",
        "        if False and run_files.is_within(c.init_from,", (T_FRESH_RUN,),
    ),
    Mutant(
        "fresh-run-keeps-the-earlier-best", "a fresh run takes none of an earlier run's checkpoints",
        "refddp/checkpoints/formats.py",
        "        keep = () if fmt is not written else (fmt.LATEST, *([fmt.BEST] if is_best else []))",
        "        keep = () if fmt is not written else (fmt.LATEST, fmt.BEST)", (T_FRESH_RUN,),
    ),
    Mutant(
        "fresh-run-forgets-its-own-format-only", "a fresh run takes none of an earlier run's checkpoints",
        "refddp/checkpoints/formats.py", "    for fmt in every():\n        keep =",
        "    for fmt in [written]:\n        keep =", (T_FRESH_RUN,),
    ),
    Mutant(
        "run-directory-lock-passed-to-forked-workers", "a second run on a run directory in use is refused",
        RUN_FILES, "        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        ("tests/checkpoints/test_checkpoint.py::test_the_run_directory_lock_ends_with_its_process_not_with"
         "_the_children_it_forked",),
    ),
    Mutant(
        "ddps-own-names-of-unused-parameters-dropped", "bad input is one line",
        PARALLEL, "    found, named = _UNUSED_INDICES.search(text), _UNUSED_NAMES.search(text)",
        "    found, named = _UNUSED_INDICES.search(text), None",
        ("tests/launch/test_exit_codes.py::test_the_unused_parameters_line_takes_ddps_own_names_where_it"
         "_gives_them",),
    ),
    *ISSUE_48,
)
