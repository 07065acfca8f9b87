"""Which calls are collectives, which are known not to be, and which the lint cannot tell.

Three kinds of callee are judged here, by name, without importing anything:

- a library function, by its qualified name (``torch.distributed.barrier``,
  ``torch.distributed.checkpoint.save``): torch.distributed's collectives, DCP, DDP's
  constructor (it broadcasts rank 0's parameters), Accelerate's collective helpers;
- a method, by its name: ``barrier``, ``all_reduce``, ``wait_for_everyone``, ``full_tensor``...
  are collectives on any object (a process group, Lightning's strategy, Accelerate's
  accelerator, a DTensor); Accelerate's ``Accelerator`` has a table of its own;
- whatever else: a call into a library that issues no torch.distributed collective (the
  standard library, torch outside ``torch.distributed``, numpy, tqdm...) is safe; a
  ``torch.distributed``, Accelerate or Lightning name missing from the tables is unknown.

Point-to-point calls (``send``, ``recv``, ``isend``, ``irecv``, ``batch_isend_irecv``) are
not collectives here: under a rank condition they are the normal way to write them.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass

# torch.distributed's public functions, each classified (tests/lint/test_lint_tables.py
# checks the list against dir(torch.distributed)): every rank of the group must call these.
COLLECTIVES = frozenset({
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object",
    "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all",
    "all_to_all_single", "barrier", "breakpoint", "broadcast", "broadcast_object_list",
    "destroy_process_group", "gather", "gather_into_tensor", "gather_object", "gather_single",
    "init_device_mesh",
    "init_process_group", "monitored_barrier", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "reduce", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "shrink_group", "split_group",
})  # fmt: skip
POINT_TO_POINT = frozenset({
    "batch_isend_irecv", "irecv", "isend", "recv", "recv_object_list", "send",
    "send_object_list", "P2POp",
})  # fmt: skip
NOT_COLLECTIVES = frozenset({
    "get_backend", "get_backend_config", "get_debug_level", "get_default_backend_for_device",
    "get_global_rank", "get_group_rank", "get_node_local_rank", "get_pg_count",
    "get_process_group_ranks", "get_rank", "get_world_size", "is_available",
    "is_backend_available", "is_gloo_available", "is_initialized", "is_mpi_available",
    "is_nccl_available", "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
    "register_rendezvous_handler", "rendezvous", "set_debug_level",
    "set_debug_level_from_env", "supports_complex", "record_comm", "GroupName",
    "get_backend_impl", "set_timeout",
    "ReduceOp", "ProcessGroup", "Work", "Backend", "Store", "TCPStore", "FileStore",
    "HashStore", "PrefixStore", "DeviceMesh", "device_mesh", "fsdp", "checkpoint", "tensor",
    "elastic", "run", "launcher", "algorithms", "nn", "rpc", "pipelining", "optim",
    "distributed_c10d", "fully_shard", "DTensor", "Shard", "Replicate", "Partial",
})  # fmt: skip
DIST = "torch.distributed"
DCP = {f"{DIST}.checkpoint.{name}" for name in
       ("save", "load", "async_save", "save_state_dict", "load_state_dict",
        "load_sharded_optimizer_state_dict")}  # fmt: skip
DDP = ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed."
       "DistributedDataParallel", "torch.nn.DistributedDataParallel")  # fmt: skip
FSDP1 = (f"{DIST}.fsdp.FullyShardedDataParallel",
         f"{DIST}.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel")  # fmt: skip
FULLY_SHARD = (f"{DIST}.fsdp.fully_shard", f"{DIST}._composable.fsdp.fully_shard",
               f"{DIST}.fsdp._fully_shard.fully_shard")  # fmt: skip
# Gathers a full state dict under FSDP (a collective), is local under DDP: cannot tell.
STATE_DICT_HELPERS = {f"{DIST}.checkpoint.state_dict.{name}" for name in
                      ("get_state_dict", "get_model_state_dict", "get_optimizer_state_dict",
                       "set_state_dict", "set_model_state_dict", "set_optimizer_state_dict")}
FUNCTIONAL = f"{DIST}._functional_collectives."
ACCELERATE_FUNCTIONS = {f"accelerate.utils.{name}" for name in
                        ("gather", "gather_object", "broadcast", "broadcast_object_list",
                         "reduce", "pad_across_processes", "wait_for_everyone")}
# Libraries whose calls may issue collectives: a name not in the tables is unknown, not safe.
COLLECTIVE_LIBRARIES = ("torch.distributed", "accelerate", "lightning", "pytorch_lightning",
                        "lightning_fabric", "deepspeed", "torchft")  # fmt: skip

# A method of these names is a collective whatever its object (a process group, Lightning's
# strategy or Fabric, Accelerate's accelerator, a DTensor gathering its shards).
COLLECTIVE_METHODS = frozenset({
    "barrier", "monitored_barrier", "all_reduce", "allreduce", "all_gather", "allgather",
    "all_gather_object", "broadcast", "broadcast_object_list", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "alltoall",
    "wait_for_everyone", "gather_for_metrics", "full_tensor", "redistribute",
})  # fmt: skip
# Accelerate's Accelerator: collectives, and what is known to issue none.
ACCELERATOR_COLLECTIVES = frozenset({
    "backward", "gather", "gather_for_metrics", "reduce", "pad_across_processes", "prepare",
    "prepare_model", "save_state", "load_state", "main_process_first",
    "local_main_process_first", "end_training", "check_trigger", "wait_for_everyone",
})  # fmt: skip
ACCELERATOR_SAFE = frozenset({
    "print", "log", "init_trackers", "unwrap_model", "save", "skip_first_batches", "autocast",
    "accumulate", "no_sync", "free_memory", "clear", "register_for_checkpointing",
    "split_between_processes", "on_main_process", "on_local_main_process", "set_trigger",
    "get_tracker", "zero_grad", "step", "prepare_data_loader", "prepare_optimizer",
    "prepare_scheduler", "trigger_sync_in_backward",
})  # fmt: skip
ACCELERATOR_MAYBE = frozenset({"clip_grad_norm_", "clip_grad_value_", "get_state_dict",
                               "save_model"})  # fmt: skip

# Methods that are not collectives on any object the lint meets in training code: str, list,
# dict, set, files and paths, loggers, progress bars, writers, tensors, optimizers, queues.
SAFE_METHODS = frozenset("""
    append extend insert pop popitem remove clear copy update get items keys values
    setdefault sort reverse index count add discard union intersection difference
    format join split rsplit strip lstrip rstrip startswith endswith replace lower upper
    encode decode zfill ljust rjust center splitlines partition rpartition find rfind
    isdigit isalpha title capitalize casefold removeprefix removesuffix
    read write writelines readline readlines flush close seek tell open exists is_file
    is_dir mkdir makedirs unlink rmdir rename touch glob rglob iterdir resolve
    read_text write_text read_bytes write_bytes relative_to with_suffix with_name stat
    info debug warning warn error exception critical log setLevel addHandler
    removeHandler handle set_description set_postfix set_postfix_str refresh
    update_to display add_scalar add_scalars add_histogram add_image add_text add_figure
    add_hparams add_graph finish item tolist numpy cpu cuda detach clone to float
    double half bfloat16 long int bool numel dim size view reshape mean sum max min abs
    argmax argmin squeeze unsqueeze permute transpose contiguous fill_ zero_ copy_
    add_ mul_ div_ sub_ clamp clamp_ isfinite all any norm state_dict load_state_dict
    zero_grad step train eval parameters named_parameters buffers named_buffers
    modules named_modules children requires_grad_ register_buffer put put_nowait
    get_nowait task_done group groups groupdict match search sub fullmatch findall
    finditer total_seconds timestamp isoformat strftime hexdigest digest is_alive start
    set is_set wait_for result done cancel submit shutdown get_last_lr print_exc
    save_pretrained push_to_hub upload_folder upload_file create_repo
""".split())  # fmt: skip

# Methods of torch.distributed's objects that do not communicate: a Work handle's wait (the
# collective was issued when it was made), a store's keys, a group's or a mesh's queries.
DIST_OBJECT_METHODS = frozenset({
    "wait", "is_completed", "is_success", "get_future", "result", "exception", "synchronize",
    "source_rank", "size", "rank", "name", "group_name", "get_group", "get_local_rank",
    "get_rank", "get_coordinate", "to_local", "set", "get", "add", "compare_set", "check",
    "delete_key", "num_keys", "set_timeout", "placements", "device_mesh",
})  # fmt: skip
EXITS = {"sys.exit", "os._exit", "exit", "quit", "builtins.exit", "builtins.quit"}
SAFE_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_")) - {
    "exit", "quit", "eval", "exec", "getattr", "callable"}  # fmt: skip
_FUNCTIONAL_NAME = re.compile(r"(all_|reduce|broadcast|gather|scatter|to_all|permute)")


@dataclass(frozen=True)
class Verdict:
    """What a call does: ``collective``, ``maybe`` (cannot tell), ``safe``, ``unknown`` or
    ``exit`` (``sys.exit``: the function ends on this rank); ``name`` for messages."""

    kind: str
    name: str
    why: str = ""


def _short(qualname: str) -> str:
    return "dist." + qualname[len(DIST) + 1 :] if qualname.startswith(DIST + ".") else qualname


def library_call(qualname: str) -> Verdict:
    """A call of a library function or class, by qualified name (``torch.distributed.barrier``)."""
    head, _, last = qualname.rpartition(".")
    if qualname in EXITS:
        return Verdict("exit", qualname)
    if qualname in DDP:
        return Verdict("collective", "DDP construction", "it broadcasts rank 0's parameters")
    if qualname in DCP:
        return Verdict("collective", _short(qualname))
    if qualname in FSDP1:
        return Verdict("maybe", "FullyShardedDataParallel(...)",
                       "it broadcasts rank 0's weights with sync_module_states=True")
    if qualname in STATE_DICT_HELPERS:
        return Verdict("maybe", _short(qualname), "it gathers a full state dict under FSDP")
    if qualname in ACCELERATE_FUNCTIONS:
        return Verdict("collective", qualname)
    if qualname.startswith(FUNCTIONAL) and _FUNCTIONAL_NAME.search(last):
        return Verdict("collective", "funcol." + last)
    if head in (DIST, f"{DIST}.distributed_c10d"):
        if last in COLLECTIVES:
            return Verdict("collective", f"dist.{last}")
        if last in POINT_TO_POINT or last in NOT_COLLECTIVES:
            return Verdict("safe", _short(qualname))
    if qualname == DIST or qualname.startswith(FULLY_SHARD) or qualname in FULLY_SHARD:
        return Verdict("safe", qualname)
    if any(qualname == lib or qualname.startswith(lib + ".") for lib in COLLECTIVE_LIBRARIES):
        return Verdict("unknown", _short(qualname),
                       f"{_short(qualname)} is not in the lint's tables")  # fmt: skip
    return Verdict("safe", qualname)


# A torchmetrics metric's (or MetricCollection's) compute() and sync() gather its states from
# every rank when torch.distributed is initialized (sync_on_compute=True, the default).
TORCHMETRICS_COLLECTIVES = frozenset({"compute", "sync"})
# A metric made with sync_on_compute=False: its compute() gathers nothing (its sync() does).
UNSYNCED_METRIC = "torchmetrics, sync_on_compute=False"


def method_call(method: str, library: str | None, keywords: dict[str, object]) -> Verdict | None:
    """A method call on an object from ``library`` (None: not known), by the method's name;
    None when the name alone does not tell."""
    if library == UNSYNCED_METRIC and method == "compute":
        return Verdict("safe", "metric.compute()")
    if library in ("torchmetrics", UNSYNCED_METRIC) and method in TORCHMETRICS_COLLECTIVES:
        return Verdict("collective", f"metric.{method}()", "a torchmetrics metric's "
                       f"{method}() gathers its states from every rank" + (
                           " unless it was made with sync_on_compute=False"
                           if method == "compute" else ""))
    if library == "accelerate":
        if method in ACCELERATOR_COLLECTIVES:
            return Verdict("collective", f"accelerator.{method}")
        if method in ACCELERATOR_MAYBE:
            return Verdict("maybe", f"accelerator.{method}",
                           "it is a collective under FSDP and DeepSpeed")  # fmt: skip
        if method in ACCELERATOR_SAFE or method in SAFE_METHODS:
            return Verdict("safe", f"accelerator.{method}")
        return Verdict("unknown", f"accelerator.{method}",
                       f"accelerator.{method} is not in the lint's tables")  # fmt: skip
    if method in COLLECTIVE_METHODS:
        return Verdict("collective", f".{method}()")
    if method in ("log", "log_dict") and keywords.get("sync_dist") is True:
        return Verdict("collective", f".{method}(..., sync_dist=True)")
    return None
