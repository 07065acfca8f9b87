"""How the model is spread over the ranks: DDP (replicated) or FSDP2 (sharded), one interface.

The trainer talks to a ``Parallel`` and never to DDP or ``fully_shard`` directly:

- ``module``: what the loop calls forward on;
- ``no_sync()``: accumulate this micro-batch's gradient locally (no gradient communication);
- ``grad_norm(max_norm)``: the gradient's total norm, the same on every rank (clipped to
  ``max_norm`` when set), from which every rank decides alike whether to apply the step;
- ``first_backward_rebuilds``: whether DDP lays its gradient buckets out anew after the first
  backward, which the trainer then makes before any step (``steps.settle_ddp_buckets``);
- ``model_state_dict`` / ``optimizer_state_dict`` (full, clean keys,
  torch's own optimizer layout, whatever the strategy: a checkpoint moves freely between DDP,
  FSDP and one process) and ``load_state`` (the reverse).

Besides, ``sync_buffers`` gives every rank rank 0's buffers, which drift apart per rank during
training, before an evaluation and a checkpoint.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from refddp.config.schema import ConfigError, TrainConfig
from refddp.launch.dist import DistContext, device_mesh


class Parallel:
    """The DDP strategy: every rank holds the whole model; gradients are all-reduced.

    One process needs no DDP: the bare model trains (DDP's reducer would only copy gradients
    into buckets and all-reduce them with nobody). DDP wraps the user's model as it is:
    ``wrapped.module`` is that model, its state dict has DDP's usual ``module.`` keys, and a
    comm hook the user registers on ``wrapped`` is the only one.
    """

    name = "ddp"

    def __init__(self, model: nn.Module, c: TrainConfig, ctx: DistContext):
        self.model, self.ctx = model, ctx
        self.parameters = list(model.parameters())  # (grad_norm's, listed once)
        self.unreduced: list[nn.Parameter] = []  # trained parameters DDP does not all-reduce
        self.alike: list[tuple[str, nn.Parameter]] = []  # (build_parallel's: checked_alike)
        self.first_backward_rebuilds = False
        if ctx.world_size == 1:
            self.wrapped: nn.Module = model
            self.module: nn.Module = torch.compile(model) if c.compile else model
            return
        device = torch.device(ctx.device)
        # DDP broadcasts rank 0's parameters and buffers here, so every replica starts equal.
        self.wrapped = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=c.find_unused_parameters,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy
        )
        self.module = torch.compile(self.wrapped) if c.compile else self.wrapped
        # Parameters the user told DDP to leave alone (``_ddp_params_and_buffers_to_ignore``, as
        # tensor- and expert-parallel code does): their gradients differ between ranks, so the
        # norm must be agreed (``agreed_norm``).
        self.unreduced = unreduced_parameters(self.wrapped)
        if self.unreduced and c.amp == "fp16":
            raise ConfigError(
                "amp: fp16 with parameters DDP ignores (_ddp_params_and_buffers_to_ignore) "
                "would let each rank's GradScaler back off alone on its own gradients; use "
                "--amp bf16 or off"
            )
        # DDP all-reduces the first backward's gradients in buckets laid out in reverse parameter
        # order, every later one's in the order the first backward's gradients became ready.
        # A sum over 3+ ranks depends on where an element lies in the buffer (gloo's and
        # NCCL's rings start each chunk's sum at another rank), so a resumed run's first step,
        # a fresh DDP's, would differ in the last bits from the uninterrupted run's step
        # there. The trainer makes that first backward, of a zero loss, before every run's
        # first step. Two ranks' sum is the same in either order; with find_unused_parameters
        # DDP keeps its first layout.
        self.first_backward_rebuilds = ctx.world_size > 2 and not c.find_unused_parameters

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Forward and backward in here accumulate gradients locally (no communication)."""
        if self.ctx.world_size == 1:
            return contextlib.nullcontext()
        return self.wrapped.no_sync()  # type: ignore[operator]

    def grad_norm(self, max_norm: float = 0.0) -> torch.Tensor:
        """The total (2-)norm of the model's gradients, before clipping them to ``max_norm``
        when it is set (as ``clip_grad_norm_`` returns it). After the gradient all-reduce every
        rank holds the same gradients, so every rank gets the same norm: a decision taken
        from it needs no collective. Under FSDP each rank holds a shard of each gradient: the
        norm is then one all-reduce of the shards' norms, made once for both uses."""
        parameters = [p for p in self.parameters if p.grad is not None]
        if self.unreduced:
            norm = self.agreed_norm(parameters)
        else:
            norm = total_norm([p.grad for p in parameters])  # (FSDP: reduced over the shards)
        if max_norm:
            clip_to_norm(parameters, max_norm, norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def agreed_norm(self, parameters: list[nn.Parameter]) -> torch.Tensor:
        """The total norm where DDP ignores some parameters: their gradients differ between
        ranks, and a norm of this rank's alone would let ranks decide differently whether to
        apply the step (the one that skips then issues a collective the others do not). They
        are taken as each rank's own shards (tensor or expert parallelism): the squares of
        their norms are summed over ranks, in one all-reduce, and added to the replicated
        parameters' square."""
        own = {id(p) for p in self.unreduced}
        shared = total_norm([p.grad for p in parameters if id(p) not in own])
        mine = total_norm([p.grad for p in parameters if id(p) in own]).to(shared)
        squares = mine.double().square().reshape(1)
        dist.all_reduce(squares)
        return (shared.double().square() + squares[0]).sqrt().to(shared.dtype)

    def checked_alike(self) -> tuple[list[tuple[str, nn.Parameter]], list[nn.Parameter]]:
        """The model's parameters as a skipped step checks them (``where_nonfinite``): those
        every rank holds alike, named, in the same order on every rank (those DDP reduces,
        whose shapes it checked at start; under FSDP all), listed by ``build_parallel`` as
        DDP lists them; and this rank's others (those DDP ignores, and any
        unfrozen since), whose number and names may differ between ranks."""
        alike = {id(p) for _, p in self.alike}
        others = [p for p in self.model.parameters() if p.requires_grad and id(p) not in alike]
        return self.alike, others

    def model_state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_state(
        self,
        model_state: dict[str, Any],
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> None:
        self.model.load_state_dict(model_state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)

    def local_numel(self) -> int:
        """Parameter elements this rank stores."""
        return sum(p.numel() for p in self.model.parameters())


def unreduced_parameters(ddp: DDP) -> list[nn.Parameter]:
    """The trained parameters DDP does not all-reduce, by DDP's own rule: it reduces a
    parameter found under any sub-module and name ``f"{module}.{name}"`` that its public
    ``parameters_to_ignore`` (the model's ``_ddp_params_and_buffers_to_ignore``) does not list.
    (So no top-level parameter is ever ignored: its key starts with a dot. A test checks this
    rule against what DDP really reduces, on every torch the suite runs on.)"""
    ignored = getattr(ddp, "parameters_to_ignore", None) or set()
    if not ignored:
        return []
    reduced = {id(p) for prefix, module in ddp.module.named_modules()
               for name, p in module.named_parameters(recurse=False)
               if p.requires_grad and f"{prefix}.{name}" not in ignored}  # fmt: skip
    return [p for p in ddp.module.parameters() if p.requires_grad and id(p) not in reduced]


# DDP's words when a parameter got no gradient in a step (torch 2.5-2.14), and its own list of
# them by index, on the next step's forward
_UNUSED = "Expected to have finished reduction in the prior iteration"
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")
# (with TORCH_DISTRIBUTED_DEBUG at INFO or DETAIL, DDP names them itself)
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: ([^\n]+)")


def unused_parameters_line(error: BaseException, wrapped: nn.Module) -> str | None:
    """One line for DDP's error about parameters that got no gradient (the most common DDP
    failure: an unused head, a branch not taken), naming them and the flag; None for any
    other error. DDP (``wrapped``) numbers them among the parameters it trains, in its
    module's ``named_parameters`` order, those it is told to ignore left out."""
    text = str(error)
    if _UNUSED not in text:
        return None
    found, named = _UNUSED_INDICES.search(text), _UNUSED_NAMES.search(text)
    which = ""
    if named:
        which = f" ({', '.join(n.strip() for n in named.group(1).split(',') if n.strip())})"
    elif found:
        ignored = getattr(wrapped, "parameters_to_ignore", None) or set()
        model = getattr(wrapped, "module", wrapped)
        names = [n for n, p in model.named_parameters() if p.requires_grad and n not in ignored]
        indices = [int(i) for i in found.group(1).split()]
        listed = [names[i] if i < len(names) else f"#{i}" for i in indices]
        which = f" ({', '.join(listed)})"  # (the ranks the launcher names)
    return (
        f"find_unused_parameters: parameters of the model got no gradient in a step{which}, "
        "which DDP must be told of: run with --find-unused-parameters, or leave them out of "
        "the model (or set requires_grad=False on them)"
    )


def clip_to_norm(parameters: list[nn.Parameter], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the gradients of ``parameters``, whose total norm is ``norm``, down to
    ``max_norm`` (``nn.utils.clip_grads_with_norm_``, torch >= 2.6; before, the same scale
    written out, plain tensors only: FSDP2 needs 2.6). A non-finite norm, a step about to be
    skipped, clips nothing: scaled by NaN every gradient would turn NaN, and the skip could
    not say whose was (``where_nonfinite``); a norm of 0 leaves the scale at 1."""
    finite = torch.nan_to_num(norm, nan=0.0, posinf=0.0, neginf=0.0)
    clip_grads_with_norm_ = getattr(nn.utils, "clip_grads_with_norm_", None)
    if clip_grads_with_norm_ is not None:
        clip_grads_with_norm_(parameters, max_norm, finite)
        return
    scale = (max_norm / (finite + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s, torch 2.5
    for p in parameters:
        p.grad.mul_(scale.to(p.grad.device))


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, as ``clip_grad_norm_`` computes it, without
    clipping: the norm of the per-tensor norms.

    ``nn.utils.get_total_norm`` (torch >= 2.6) first groups the tensors by device and dtype,
    for the foreach kernels a GPU has. The CPU has none: there it computes the same per-tensor
    norms, so for plain CPU tensors of one dtype (the grouping keeps their order) the norm of
    norms computed here gives its bits at about half its cost (benchmarks/README.md). It is
    also the only way before torch 2.6."""
    get_total_norm = getattr(nn.utils, "get_total_norm", None)
    # (Not a DTensor's shards, FSDP's, nor mixed dtypes, which get_total_norm reorders.)
    one_cpu_kind = all(type(g) is torch.Tensor and g.is_cpu and g.dtype == grads[0].dtype
                       for g in grads)  # fmt: skip
    if get_total_norm is not None and not one_cpu_kind:
        return get_total_norm(grads)
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
               nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d)  # fmt: skip


class FullyShardedParallel(Parallel):
    """FSDP2: each rank stores 1/N of every parameter, its gradient and its optimizer state.

    Blocks (the built-in models' layers, or what a user model lists in ``fsdp_blocks``) and
    the root are each a ``fully_shard`` unit on an explicit 1-D mesh of this group's devices.
    """

    name = "fsdp"

    def __init__(self, model: nn.Module, c: TrainConfig, ctx: DistContext):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.model, self.ctx = model, ctx
        device = torch.device(ctx.device)
        mesh = device_mesh(device.type, ctx.world_size)
        # As DDP does at construction: every rank starts from rank 0's parameters and buffers
        # (init_from weights are read by rank 0 only).
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        policy = MixedPrecisionPolicy()
        kept_in_float32: list[nn.Module] = []
        if c.amp == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            # BatchNorm keeps its parameters in float32, beside its float32 running statistics
            # (torch's batch_norm refuses bfloat16 weights with them; FSDP1 kept BatchNorm out
            # of mixed precision by default): each is a unit of its own, not cast.
            kept_in_float32 = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
            for norm in kept_in_float32:
                fully_shard(norm, mesh=mesh)
        for index, block in enumerate(fsdp_blocks(model)):
            if c.compile:
                _compile_forward(block, index)
            if block not in kept_in_float32:
                fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.wrapped = self.module = model
        self.parameters = list(model.parameters())  # the sharded ones
        self.unreduced = []  # (the norm is reduced over the shards already)
        self.first_backward_rebuilds = False  # (no buckets: one reduce-scatter per unit)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return _without_gradient_sync(self.model)

    def model_state_dict(self) -> dict[str, Any]:
        """The full model, on rank 0's CPU ({} elsewhere): a collective, every rank calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Full optimizer state in ``optimizer.state_dict()``'s layout (parameter indices), on
        rank 0 ({} elsewhere): a collective, every rank calls it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        if not optimizer.state:  # never stepped, on every rank alike: nothing to gather
            # (DCP would first create the state with a real optimizer step at lr 0, which
            # changes the run: AdamW's step count, SGD's dampened momentum).
            return optimizer.state_dict() if dist.get_rank() == 0 else {}
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        by_name = get_optimizer_state_dict(self.model, optimizer, options=options)
        return _names_to_indices(by_name, self.model) if by_name else {}

    def load_state(
        self,
        model_state: dict[str, Any],
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> None:
        """Every rank holds the full state; each keeps its own shard of it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.model, dict(model_state), options=options)
        if optimizer is None or optimizer_state is None:
            return
        if not optimizer_state["state"]:  # saved before any step: as in optimizer_state_dict
            optimizer.load_state_dict(optimizer_state)
            return
        by_name = _indices_to_names(optimizer_state, self.model)
        set_optimizer_state_dict(self.model, optimizer, by_name, options=options)

    def local_numel(self) -> int:
        return sum(
            p.to_local().numel() if hasattr(p, "to_local") else p.numel()
            for p in self.model.parameters()
        )


def _compile_forward(block: nn.Module, index: int) -> None:
    """torch.compile one FSDP unit's forward, which then runs between FSDP's hooks.

    Compiling the whole model compiles nothing under FSDP2 (torch 2.13): its hooks break the
    graph at every unit, and a unit that is a torch layer (``nn.Linear``) is never traced from
    there. The forward is traced from this module's frame instead, so torch layers inline.

    Each unit gets a code object of its own: dynamo keeps compiled graphs per code object, and
    units sharing one would each cost a recompile (their modules differ), past whose limit
    (``recompile_limit``, 8) the remaining blocks of a deep model would silently run eagerly.
    """
    forward = block.forward

    def unit_forward(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    unit_forward.__code__ = unit_forward.__code__.replace(co_name=f"unit_forward_{index}")
    block.forward = torch.compile(unit_forward)  # type: ignore[method-assign]


def runs_in_lockstep(model: nn.Module) -> bool:
    """True when every forward is a collective (FSDP gathers parameters): ranks must then run
    the same number of forwards, even over shards of different lengths."""
    import torch.distributed.fsdp as fsdp

    module = getattr(fsdp, "FSDPModule", None)  # torch >= 2.6 (refddp's FSDP needs it)
    return module is not None and isinstance(model, module)


def fsdp_blocks(model: nn.Module) -> list[nn.Module]:
    """The sub-modules that each become an FSDP unit (gathered one at a time in forward).

    A model may list them itself as ``fsdp_blocks`` (a list of modules, or a method returning
    one); a Hugging Face model names its blocks' classes in ``_no_split_modules`` (GPT-2:
    ``GPT2Block``); otherwise every direct child with parameters of a top-level
    ``nn.Sequential`` (``net``, ``features``) or of the model itself.
    """
    listed = getattr(model, "fsdp_blocks", None)
    if listed is not None:
        # A method returning the blocks, or the blocks (an nn.ModuleList is callable too).
        blocks = listed() if callable(listed) and not isinstance(listed, nn.Module) else listed
        return [b for b in blocks if isinstance(b, nn.Module)]
    unsplit = set(getattr(model, "_no_split_modules", None) or ())
    if unsplit:
        return [m for m in model.modules() if m is not model and type(m).__name__ in unsplit]
    blocks: list[nn.Module] = []
    for child in model.children():
        inner = list(child.children()) if isinstance(child, nn.Sequential) else [child]
        blocks += [m for m in inner if any(True for _ in m.parameters(recurse=True))]
    return blocks


@contextlib.contextmanager
def _without_gradient_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _names_to_indices(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """FQN-keyed optimizer state (torch.distributed.checkpoint) to optimizer.state_dict()'s.

    Index i is the i-th parameter of ``model.parameters()``, the order refddp's optimizers
    take them in (one group: ``build_optimizer``).
    """
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _indices_to_names(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    names = [name for name, _ in model.named_parameters()]
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in state["state"].items()}, "param_groups": groups}


def build_parallel(model: nn.Module, c: TrainConfig, ctx: DistContext) -> Parallel:
    """Wrap ``model`` (already on this rank's device) for ``c.strategy``."""
    kind = FullyShardedParallel if c.strategy == "fsdp" else Parallel
    parallel = kind(model, c, ctx)
    own = {id(p) for p in parallel.unreduced}
    parallel.alike = [(name, p) for name, p in model.named_parameters()
                      if p.requires_grad and id(p) not in own]  # fmt: skip
    return parallel


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's buffers (BatchNorm statistics drift per rank during training)."""
    for buffer in model.buffers():
        dist.broadcast(buffer, src=0)
