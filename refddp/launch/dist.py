"""Process-group set-up and the few distributed idioms every other module uses.

One place for: where this rank runs (``DistContext``), the loopback-only store, "rank 0 does the
work, then every rank meets" (``rank0_then_meet``) and rank-aware logging. The hang watchdog
is ``refddp/training/watchdog.py``.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose. This module binds ``group.WORLD`` as
# the default argument of ten functions when it is imported; DDP imports it (through
# torch._dynamo) on first use, i.e. after init_process_group, so those defaults would keep the
# default group alive for good: destroy_process_group could not free it, and gloo's threads
# would run on into interpreter shutdown, where they abort a finished run (issue 15's
# "terminate called without an active exception"). Imported now, the defaults are None.
import torch.distributed.nn.functional  # noqa: F401, E402

from refddp.launch.slurm import rendezvous_store, srun_task  # noqa: E402

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

T = TypeVar("T")
log = logging.getLogger("refddp")


@dataclass(frozen=True)
class DistContext:
    """Where a rank runs. Also the ``dist_ctx`` fixture's value inside a rank-side test."""

    rank: int
    world_size: int
    local_rank: int
    device: str
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_placeholder(self) -> bool:
        """True for the harness's driver-side stand-in, which each rank replaces with its own."""
        return self.rank < 0


class RankZeroError(RuntimeError):
    """Raised on ranks other than 0 when work that only rank 0 ran failed."""


def loopback_store(timeout_s: float = 300.0) -> dist.TCPStore:
    """A TCPStore server that listens on 127.0.0.1 only, on a port the OS picks.

    ``TCPStore`` binds every interface when given a host name; handing it a socket we bound to
    loopback keeps a single-machine job unreachable from the network, with no free-port probing.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    try:
        fd = os.dup(sock.fileno())  # the store's own copy of the listening socket
        try:
            return _store_on(fd, port, timeout_s, use_libuv=True)
        except NotImplementedError:  # refused before it took the socket: torch < 2.6, whose
            os.close(fd)  # libuv store cannot start from one; the legacy backend can
            return _store_on(os.dup(sock.fileno()), port, timeout_s, use_libuv=False)
    finally:
        sock.close()


def _store_on(fd: int, port: int, timeout_s: float, use_libuv: bool) -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=True,
        master_listen_fd=fd,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        use_libuv=use_libuv,
    )


GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # torch reads it when it creates a gloo group
_IFF_LOOPBACK = 0x8


def loopback_interface() -> str:
    """The name of this machine's loopback network interface (``lo`` on Linux)."""
    for _, name in socket.if_nameindex():
        try:
            with open(f"/sys/class/net/{name}/flags") as f:
                if int(f.read(), 16) & _IFF_LOOPBACK:
                    return name
        except (OSError, ValueError):
            continue
    return "lo0" if sys.platform == "darwin" else "lo"


def pin_gloo_to_loopback() -> None:
    """Make every gloo group this process, and the ranks it starts, creates use 127.0.0.1 only.

    Without ``GLOO_SOCKET_IFNAME`` gloo binds the address the host name resolves to, which on
    a typical node is the LAN address; naming the loopback interface keeps a job on one machine
    unreachable from the network whatever ``/etc/hosts`` says. Local jobs only: ranks of a
    multi-node job (plain torchrun) must reach each other, so nothing there calls this.
    """
    os.environ[GLOO_SOCKET_IFNAME] = loopback_interface()


def under_torchrun() -> bool:
    """True inside a rank started by torchrun / torch.distributed.run."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def choose_device(requested: str, local_rank: int) -> torch.device:
    """``auto`` means this rank's GPU when CUDA is available, else the CPU."""
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


_owns_group = False
_ends_unfinalized = False  # set by ends_unfinalized(), for end_process's processes
_meshes: list[DeviceMesh] = []  # made by device_mesh(); teardown() releases their group


def enable_nccl_flight_recorder(dump_dir: str) -> None:
    """Make an NCCL timeout dump every rank's recent collectives instead of only freezing.

    Must run before the NCCL group is created (torch reads these when it builds the group).
    """
    os.makedirs(dump_dir, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # fail, don't hang, on error
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")  # collectives remembered
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(dump_dir, "nccl_trace_rank_")
    )


def init_distributed(
    device: str = "auto", timeout_s: float = 300.0, trace_dir: str | None = None
) -> DistContext:
    """Join the job's process group and say where this rank runs.

    Under torchrun: env://. Already initialised (a test harness, a user's own set-up): use
    that group. A task of an srun step of several tasks: one rank per task
    (``refddp/launch/slurm.py``). Otherwise: a one-rank group in this process. On CUDA,
    ``trace_dir`` receives NCCL flight-recorder dumps if a collective times out.
    """
    global _owns_group
    task = None
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    elif under_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
    elif (task := srun_task()) is not None:
        rank, world_size, local_rank = task.rank, task.world_size, task.local_rank
    else:
        rank, world_size, local_rank = 0, 1, 0
    dev = choose_device(device, task.device_index() if task else local_rank)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        if trace_dir:
            enable_nccl_flight_recorder(trace_dir)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if under_torchrun():
            dist.init_process_group(
                backend,
                store=_attempt_store(world_size, timeout),
                timeout=timeout,
                rank=rank,
                world_size=world_size,
            )
            exit_with_parent()  # the elastic agent starts ranks in their own session
        elif task is not None:
            store = rendezvous_store(task, timeout)
            dist.init_process_group(
                backend, store=store, timeout=timeout, rank=rank, world_size=world_size
            )
        else:
            pin_gloo_to_loopback()  # one process: nothing needs to reach it
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
        _owns_group = True
    return DistContext(rank, world_size, local_rank, str(dev), backend)


def _attempt_store(world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The rendezvous store for this restart attempt of a torchrun job.

    By default torch 2.13's elastic agents share their own TCPStore with the ranks, one for
    every restart attempt, and ``env://`` adds no per-attempt prefix, so restarted ranks would
    read the previous attempt's gloo addresses and hang connecting to dead peers: keys are
    namespaced by the attempt (the agents' restart count). With
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` each attempt's rank 0 hosts a new store on a new
    port instead, and no prefix is taken: a node started again (a new agent) counts its
    restarts from 0 while the surviving agents count on, and with prefixes their ranks would
    look for each other in different namespaces.
    """
    agents = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agents and int(os.environ["RANK"]) == 0,
        timeout=timeout,
        multi_tenant=True,
    )
    if not agents:
        return store
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"refddp/attempt_{attempt}", store)


def exit_with_parent(poll_s: float = 0.5) -> None:
    """Exit this process when its parent dies, even by SIGKILL: no orphaned ranks."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="refddp-parent-watch", daemon=True).start()


def device_mesh(device_type: str, world_size: int) -> DeviceMesh:
    """A 1-D device mesh over the default group, given explicitly (the default mesh picks the
    accelerator's device type even on a gloo group); ``teardown`` lets go of its group."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (world_size,))
    _meshes.append(mesh)
    return mesh


def teardown() -> None:
    """Leave the process group, if ``init_distributed`` created it, which stops its threads.

    Never raises: it runs in ``finally`` blocks, where an error of its own (NCCL after a peer
    died, say) would replace the one the user needs; and once a run's work is done, a group
    that will not close changes nothing of it. Such an error is logged.

    One exception: in a process that ``end_process`` ends (``python -m refddp.train``, the
    doctor), before torch 2.8 a gloo group is not destroyed (``destroy_can_hang``): there
    ``destroy_process_group``, its peer done or gone, hung now and then after a finished run
    (docs/torch-versions.md), and the process's exit, without finalization, ends gloo's
    threads anyway.
    """
    global _owns_group
    owned, _owns_group = _owns_group, False
    if owned:
        _free_the_run()
    try:
        if owned and dist.is_initialized() and not (_ends_unfinalized and destroy_can_hang()):
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("leaving the process group failed", exc_info=True)
    release_meshes()
    if owned:
        # FSDP's modules and their state form reference cycles that still hold the group;
        # collect them now rather than at some later allocation (or never, before exit).
        gc.collect()


def destroy_can_hang() -> bool:
    """torch before 2.8, a gloo group: ``destroy_process_group`` hung on 2.5 in two of three
    runs of the compatibility suite (once each in two of its ~100 two-rank jobs), after the
    run had finished; never on 2.13 or 2.14. The likely cause: the group's destructor joins
    its threads holding the GIL, which a thread still releasing the last collective needs
    (pytorch/pytorch#154976, merged June 2025; refddp/testing/rank/leftovers.py saw the same
    hang). 2.6 and 2.7 are not tested here, so they are counted in."""
    from refddp.config.torch_support import torch_version

    return torch_version() < (2, 8) and "gloo" in str(dist.get_backend())


def ends_unfinalized() -> None:
    """Mark this process as one that leaves with ``os._exit`` once its main returns
    (``end_process``): ``teardown`` may then leave a group that can hang to the exit."""
    global _ends_unfinalized
    _ends_unfinalized = True


def release_meshes() -> bool:
    """Let go of the groups held by the meshes ``device_mesh`` made; True if there were any.

    torch 2.13: a mesh holds its group (``_pg_registry``), and DTensor's caches keep the mesh
    alive after the model is gone, so a destroyed group's gloo threads would run on into
    interpreter shutdown (and a warm test rank would carry the mesh into the next test).
    """
    had = bool(_meshes)
    for mesh in _meshes:
        getattr(mesh, "_pg_registry", {}).clear()
    _meshes.clear()
    return had


def _free_the_run() -> None:
    """Free what may still hold the group (a trainer's DDP reducer) before leaving it.

    torch 2.13: a reducer that holds the last reference to a destroyed gloo group joins gloo's
    threads while holding the GIL, and a gloo thread still freeing a backward's all-reduce needs
    the GIL to do so: the process hangs at exit. Released through the group's own Python handle
    (``destroy_process_group``), the join lets the GIL go. So the frames of an exception in
    flight (a trainer is in them) and reference cycles are freed first.
    """
    in_flight = sys.exc_info()[1]
    if in_flight is not None:
        traceback.clear_frames(in_flight.__traceback__)
    gc.collect()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank0_then_meet(work: Callable[[], T]) -> T | None:
    """Run ``work`` on rank 0 only; then every rank meets at one broadcast.

    The broadcast carries rank 0's error, if any, so a failure there (a full disk, say) fails
    every rank at once instead of leaving them blocked in the next collective. ``work`` must not
    itself issue collectives: only rank 0 runs it.
    """
    status: list[str | None] = [None]
    result: T | None = None
    error: BaseException | None = None
    if rank() == 0:
        try:
            result = work()
        except Exception as exc:  # re-raised below, after the other ranks are told
            error = exc
            status[0] = f"{type(exc).__name__}: {exc}"
    if world_size() > 1:
        dist.broadcast_object_list(status, src=0)
    if error is not None:
        raise error
    if status[0] is not None:
        raise RankZeroError(f"rank 0 failed: {status[0]}")
    return result


def agree_any(*flags: bool, device: torch.device | str = "cpu") -> list[bool]:
    """Every rank learns, for each flag, whether any rank raised it (one small all-reduce)."""
    values = torch.tensor([float(f) for f in flags], device=device)
    if world_size() > 1:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(v) for v in values.tolist()]


class RankPrefixFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.prefix = f"[rank {rank}] "

    def filter(self, record: logging.LogRecord) -> bool:
        record.rankprefix = self.prefix
        return True


def setup_logging(rank: int, log_all_ranks: bool) -> None:
    """Rank 0 logs at INFO; other ranks only warnings, unless every rank should log."""
    handler = logging.StreamHandler(sys.stderr)
    prefix = "%(rankprefix)s" if log_all_ranks else ""
    handler.setFormatter(logging.Formatter(f"{prefix}%(asctime)s %(message)s", "%H:%M:%S"))
    handler.addFilter(RankPrefixFilter(rank))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO if (rank == 0 or log_all_ranks) else logging.WARNING)
