"""How the model is spread over the ranks: DDP (replicated) or FSDP2 (sharded), one interface.

The trainer talks to a ``Parallel`` and never to DDP or ``fully_shard`` directly:

- ``module``: what the loop calls forward on;
- ``no_sync()``: accumulate this micro-batch's gradient locally (no gradient communication);
- ``set_flags(flags)``, ``backward(total, seed)``, ``agree(flags)``: every rank learns, per
  flag, whether any rank raised it. Under DDP the flags ride the step's own gradient
  all-reduce (``Parallel``), so the per-step agreement costs no extra collective (past 44
  ranks that are not a power of two, a float64 bucket of their own: ``carrier_dtype``);
  under FSDP it is one small all-reduce;
- ``clip_grad_norm_``, ``model_state_dict`` / ``optimizer_state_dict`` (full, clean keys,
  torch's own optimizer layout, whatever the strategy: a checkpoint moves freely between DDP,
  FSDP and one process) and ``load_state`` (the reverse).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.overrides import has_torch_function

from refddp.config import TrainConfig
from refddp.dist import DistContext, device_mesh
from refddp.step_flags import FLAG_COUNT

try:  # the call into autograd's engine that torch.autograd.backward ends in
    from torch.autograd.graph import _engine_run_backward
except ImportError:  # pragma: no cover - a torch without it takes the public call
    _engine_run_backward = None


class Parallel:
    """The DDP strategy: every rank holds the whole model; gradients are all-reduced.

    One process needs no DDP: the bare model trains (DDP's reducer would only copy gradients
    into buckets and all-reduce them with nobody), and the flags need no agreement.

    Several ranks carry the step's flags on DDP's own (C++) gradient all-reduce: DDP wraps the
    model in a ``FlagCarrier``, whose one extra parameter's gradient *is* the flags, handed to
    the synced backward as a second root (``backward``). DDP averages every gradient it
    reduces, so the agreed flags are that gradient times the world size, its counts rounded
    back to integers (``step_flags._decode``; exact by ``carrier_dtype``'s choice). A
    Python comm hook appending them to the first bucket cost ~80 us a step on the CPU (the
    hook's call, a copy of the bucket, DDP's copy back, a callback that takes the GIL):
    ``benchmarks/README.md``. With ``find_unused_parameters`` DDP would find the carrier
    unused (it is not reached from the model's output) and refuse its gradient, so there the
    hook (``_allreduce_with_flags``) carries them.
    """

    name = "ddp"
    _carrier: nn.Parameter | None = None  # the flags' parameter (several ranks, DDP)
    _syncing = True  # False inside no_sync(): the backward then carries no flags

    def __init__(self, model: nn.Module, c: TrainConfig, ctx: DistContext):
        self.model, self.ctx = model, ctx
        self._flags = _FlagState()
        if ctx.world_size == 1:
            self.wrapped: nn.Module = model
            self.module: nn.Module = torch.compile(model) if c.compile else model
            return
        device = torch.device(ctx.device)
        wrapped = model
        if not c.find_unused_parameters:
            wrapped = FlagCarrier(model, device, ctx.world_size)
            self._carrier = wrapped.flags
            self._carrier.register_post_accumulate_grad_hook(self._flags.carried)
            self._flags.zeros = torch.zeros_like(self._carrier)
        # DDP broadcasts rank 0's parameters and buffers here, so every replica starts equal.
        self.wrapped = DDP(
            wrapped,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=c.find_unused_parameters,
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy
        )
        if self._carrier is None:
            self.wrapped.register_comm_hook(self._flags, _allreduce_with_flags)
        self.module = torch.compile(self.wrapped) if c.compile else self.wrapped

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward and backward in here accumulate gradients locally (no communication)."""
        if self.ctx.world_size == 1:
            yield
            return
        syncing, self._syncing = self._syncing, False
        try:
            with self.wrapped.no_sync():  # type: ignore[operator]
                yield
        finally:
            self._syncing = syncing

    def set_flags(self, flags: torch.Tensor) -> None:
        """The flags the next synced backward carries (set before it)."""
        self._flags.local = flags
        self._flags.agreed = None
        self._flags.ready_at = None

    def backward(self, total: torch.Tensor, seed: torch.Tensor) -> None:
        """``total``'s backward from ``seed`` (``run_backward``); outside ``no_sync`` with the
        step's flags as the carrier's gradient (zeros if none were set), agreed when it
        returns. Under DDP every backward outside ``no_sync`` must come through here: one
        without the carrier's gradient leaves its bucket, the first, unready, and DDP then
        reduces no bucket at all (each rank keeps its own gradients) and raises only at the
        next forward."""
        carrier = self._carrier
        if carrier is None or not self._syncing:
            run_backward(total, seed)
            return
        flags = self._flags.local
        sent = self._flags.zeros if flags is None else flags.to(carrier.dtype)
        carrier.grad = None  # the last step's agreed flags: not to be added to
        run_backward(total, seed, carrier, sent)
        if flags is not None:
            self._flags.agreed = carrier.grad * self.ctx.world_size  # DDP averaged them
            self._flags.sent, self._flags.local = flags, None

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """Summed over ranks: taken from the gradient all-reduce if it carried ``flags``."""
        if self.ctx.world_size == 1:
            return flags
        if self._flags.agreed is not None and self._flags.sent is flags:
            return self._flags.agreed
        return _all_reduce_sum(flags)  # no gradient was reduced (nothing trainable this step)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        return nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

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

    @property
    def gradients_ready_at(self) -> float | None:
        """When this rank's last synced backward had computed every gradient
        (``time.perf_counter``), before waiting for other ranks' all-reduces: an engine
        callback at the backward's end (the comm hook's last bucket with
        ``find_unused_parameters``). None where nothing is all-reduced in buckets (one
        process, FSDP)."""
        return self._flags.ready_at

    def local_numel(self) -> int:
        """Parameter elements this rank stores."""
        return sum(p.numel() for p in self.model.parameters())


class FlagCarrier(nn.Module):
    """What DDP wraps: the user's model, and ``flags``, a parameter the model never uses whose
    gradient the synced backward sets to the step's flags (``Parallel.backward``), of
    ``carrier_dtype``."""

    def __init__(self, model: nn.Module, device: torch.device, world_size: int):
        super().__init__()
        ignored = getattr(model, "_ddp_params_and_buffers_to_ignore", None) or ()
        if not any(p.requires_grad for name, p in model.named_parameters() if name not in ignored):
            # DDP's own refusal, which the carrier's parameter would otherwise get past (the
            # run would then fail at its first backward, saying less).
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")  # fmt: skip
        self.model = model
        dtype = carrier_dtype(model, world_size)
        self.flags = nn.Parameter(torch.zeros(FLAG_COUNT, dtype=dtype, device=device))
        if ignored:  # DDP names them from the module it wraps: this one
            self._ddp_params_and_buffers_to_ignore = [f"model.{name}" for name in ignored]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


def carrier_dtype(model: nn.Module, world_size: int) -> torch.dtype:
    """The flags' dtype under DDP: the trainable parameters' where it keeps the agreed counts
    exact (one bucket with their gradients, so no all-reduce of its own), else float64.

    DDP scales each rank's gradient by 1 / world size (divides it in place, or multiplies the
    copy it makes by the reciprocal, as torch 2.13 does the carrier's), then sums; each count
    part is below ``COUNT_PART`` (2**12, for fewer than 2**24 targets a rank). Scaling by a
    power of two is exact and the sum's 2**-k steps fit float32's 24 bits up to 4096 ranks.
    Otherwise every scaling and addition rounds: float32 (unit 2**-24) is off the count by at
    most W * (W + 2) * 2**-12, under a half (so rounded back exactly) up to 44 ranks; beyond,
    float64 (unit 2**-53) up to about 10**6. Half-precision gradients hold too few bits."""
    trainable = next((p.dtype for p in model.parameters()
                      if p.requires_grad and p.is_floating_point()), None)  # fmt: skip
    if trainable == torch.float64:
        return torch.float64
    power_of_two = world_size & (world_size - 1) == 0
    exact_in_float32 = world_size <= 44 or (power_of_two and world_size <= 4096)
    return torch.float32 if exact_in_float32 else torch.float64


class _FlagState:
    """The flags' way through the synced backward: the flags set for it, those it carried and
    their agreed sums, and when this rank's compute for it was done (the comm hook's state
    with ``find_unused_parameters``)."""

    def __init__(self) -> None:
        self.local: torch.Tensor | None = None  # set for the next synced backward
        self.sent: torch.Tensor | None = None  # what the last one carried (``agree`` checks)
        self.agreed: torch.Tensor | None = None
        self.ready_at: float | None = None  # when the last synced backward's compute ended
        self.zeros: torch.Tensor | None = None

    def carried(self, carrier: torch.Tensor) -> None:
        """The carrier's gradient is in (the backward's first step): note when the backward's
        compute ends, in a callback the engine runs once every gradient is in and before DDP
        waits for its all-reduces (DDP queues that wait when its last bucket is ready)."""
        torch.autograd.Variable._execution_engine.queue_callback(self.computed)

    def computed(self) -> None:
        self.ready_at = time.perf_counter()


def _allreduce_with_flags(state, bucket):  # type: ignore[no-untyped-def]
    """(A ``dist.GradBucket`` -> ``Future[Tensor]`` comm hook; unannotated because DDP checks
    annotations at run time and this module's are strings.) With ``find_unused_parameters``.

    DDP's default all-reduce (average by pre-dividing, as its C++ path does), plus flags.

    Bucket 0 also carries ``state.local``, summed, into ``state.agreed``: appending copies
    the bucket, and DDP caps bucket 0 at 1 MB (``first_bucket_bytes``), the others at 25 MB.
    """
    world = dist.get_world_size()
    state.ready_at = time.perf_counter()  # this rank's compute for the bucket is done
    grads = bucket.buffer().div_(world)
    if state.local is None or bucket.index() != 0:
        fut = dist.all_reduce(grads, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    flags = state.local
    joined = torch.cat([grads, flags.to(grads.dtype)])
    fut = dist.all_reduce(joined, async_op=True).get_future()

    def split(f: torch.futures.Future) -> torch.Tensor:
        out = f.value()[0]
        state.agreed = out[-len(flags) :].to(flags.dtype)
        state.sent = flags
        return out[: -len(flags)]

    return fut.then(split)


def run_backward(
    total: torch.Tensor,
    seed: torch.Tensor,
    carrier: torch.Tensor | None = None,
    flags: torch.Tensor | None = None,
) -> None:
    """``total.backward(seed)`` where ``seed`` was made for ``total`` (``Trainer.backward_seed``:
    its shape, dtype and device), and with ``carrier`` a second root whose gradient is
    ``flags`` (``Parallel.backward``): straight into the engine, as ``torch.autograd.backward``
    ends, without the Python that normalises and checks its arguments first (6-12 us a
    backward in a hot loop; in the demo's 0.8 ms step on the CPU, +17-25 us over a plain step
    became +4-10). Its shape check is ``backward_seed``'s (a seed that merely broadcasts would
    be summed down, not refused). A tensor subclass, a torch-function mode or a functorch
    transform takes the public call, which dispatches them."""
    roots, grads = ((total,), (seed,)) if carrier is None else ((total, carrier), (seed, flags))
    if (
        _engine_run_backward is None
        or has_torch_function(roots + grads)
        or torch._C._are_functorch_transforms_active()
    ):
        if carrier is None:  # dispatched by Tensor.backward on every torch version
            total.backward(seed)
        else:
            torch.autograd.backward(roots, grads)
        return
    _engine_run_backward(roots, grads, False, False, (), allow_unreachable=True,
                         accumulate_grad=True)  # fmt: skip


def _all_reduce_sum(flags: torch.Tensor) -> torch.Tensor:
    flags = flags.clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flags)
    return flags


class FullyShardedParallel(Parallel):
    """FSDP2: each rank stores 1/N of every parameter, its gradient and its optimizer state.

    Blocks (the built-in models' layers, or what a user model lists in ``fsdp_blocks``) and
    the root are each a ``fully_shard`` unit on an explicit 1-D mesh of this group's devices.
    """

    name = "fsdp"

    def __init__(self, model: nn.Module, c: TrainConfig, ctx: DistContext):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.model, self.ctx = model, ctx
        self._flags = _FlagState()  # unused: FSDP agrees apart
        device = torch.device(ctx.device)
        mesh = device_mesh(device.type, ctx.world_size)
        # As DDP does at construction: every rank starts from rank 0's parameters and buffers
        # (init_from weights are read by rank 0 only).
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        policy = MixedPrecisionPolicy()
        if c.amp == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for index, block in enumerate(fsdp_blocks(model)):
            if c.compile:
                _compile_forward(block, index)
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self.wrapped = self.module = model

    def no_sync(self) -> contextlib.AbstractContextManager:
        return _without_gradient_sync(self.model)

    def set_flags(self, flags: torch.Tensor) -> None:
        pass

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        return _all_reduce_sum(flags)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

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


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: an FSDP (DTensor) gradient's local shard, in place."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def runs_in_lockstep(model: nn.Module) -> bool:
    """True when every forward is a collective (FSDP gathers parameters): ranks must then run
    the same number of forwards, even over shards of different lengths."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


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
    if c.strategy == "fsdp":
        return FullyShardedParallel(model, c, ctx)
    return Parallel(model, c, ctx)
