"""Start N local ranks through torch.distributed.run's elastic agent (torchrun, in-process).

We pass torchrun's own arguments to its own parser, so ``--max-restarts`` and everything else
behave exactly as under torchrun. The one addition is a rendezvous backend whose stores listen
on 127.0.0.1 only: a single-machine job is never reachable from the network. Multi-node jobs
use plain ``torchrun`` (see the README) and never come through here.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from refddp.launch.dist import loopback_store, pin_gloo_to_loopback
from refddp.launch.error_file import AGREED_STOP, KIND_KEY, LAUNCHED_ENV, USAGE

LOOPBACK_BACKEND = "refddp-loopback"
USAGE_EXIT = 2
CONFIG_ENV = "REFDDP_RESOLVED_CONFIG"  # the launcher's resolved config, as JSON, for its ranks


class _LoopbackRendezvous(DynamicRendezvousHandler):
    def get_backend(self) -> str:
        return LOOPBACK_BACKEND

    def _create_tcp_store_server(self, master_addr: str, master_port: int):  # type: ignore[override]
        return loopback_store()  # the store the ranks' process group bootstraps from


def _loopback_handler(params: RendezvousParameters) -> RendezvousHandler:
    store = loopback_store()
    return _LoopbackRendezvous.from_backend(
        params.run_id,
        store,
        C10dRendezvousBackend(store, params.run_id),
        params.min_nodes,
        params.max_nodes,
        "127.0.0.1",
    )


def torchrun_args(module: str, nproc: int, max_restarts: int) -> list[str]:
    return [
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        "0.1",
        "--rdzv-backend",
        LOOPBACK_BACKEND,
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
        "--module",
        module,
    ]


def launch(
    module: str, env: dict[str, str], nproc: int, max_restarts: int, out: str, job: str
) -> int:
    """Run ``python -m MODULE`` on ``nproc`` local ranks; the job's exit code.

    ``job`` names it in the one-line failure report ("training failed: ...").

    Ranks get their settings through ``env`` (the trainer passes the config it already resolved
    and checked), so they never re-parse the command line and all agree on it.
    """
    refused = launcher_refused()
    if refused:  # a usage error on this torch: torchrun does the job
        print(f"error: {refused}", file=sys.stderr)
        return USAGE_EXIT
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    try:
        rendezvous_handler_registry.register(LOOPBACK_BACKEND, _loopback_handler)
    except ValueError:
        pass  # registered by an earlier launch in this process
    # One thread per rank unless the user chose: ranks share the cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # The agent logs every rank failure as a multi-line banner; we report it in one line.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ.update(env)
    os.environ[LAUNCHED_ENV] = "1"
    pin_gloo_to_loopback()  # the ranks inherit it: their gloo groups listen on 127.0.0.1 only
    config, cmd, cmd_args = config_from_args(parse_args(torchrun_args(module, nproc, max_restarts)))
    # SLURM sends SIGUSR1 before a time limit (sbatch --signal). torch's agent passes SIGTERM,
    # SIGINT, SIGHUP and SIGQUIT on to the ranks and would die of SIGUSR1 (its
    # --signals-to-handle, torch >= 2.9, changes that list): a handler of our own stops it the
    # same way, on any torch, and the ranks stop together with a checkpoint.
    previous = signal.signal(signal.SIGUSR1, _stop_the_agent)
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as exc:
        return _report_failure(exc, out, job)
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        print(f"stopped by {name}; rerun the same command to resume", file=sys.stderr)
        return 128 + int(exc.sigval)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return 0


def launcher_refused() -> str | None:
    """None where this torch has the torchrun internals the launcher builds on (undocumented,
    present from torch 2.5 to at least 2.14), else the one line that says to use torchrun."""
    import torch
    import torch.distributed.run as run

    missing = [name for name in ("parse_args", "config_from_args") if not hasattr(run, name)]
    if not hasattr(DynamicRendezvousHandler, "_create_tcp_store_server"):
        missing.append("DynamicRendezvousHandler._create_tcp_store_server")
    if not missing:
        return None
    return (
        f"--nproc: this torch ({torch.__version__}) lacks {', '.join(missing)}, which refddp's "
        "launcher needs (to keep a local job on 127.0.0.1); start the ranks with torchrun "
        "--nproc-per-node N -m refddp.train instead"
    )


def _stop_the_agent(signum: int, frame: object) -> None:
    """As torch's agent handles SIGTERM: it then sends the signal to every rank and waits."""
    raise SignalException(f"process {os.getpid()} got signal {signum}", signal.Signals(signum))


def _report_failure(exc: ChildFailedError, out: str, job: str) -> int:
    """One line per distinct user error the ranks recorded, one per stop the ranks agreed on,
    else one line naming every failure."""
    failures = sorted(exc.failures.items())
    usage = _recorded(failures, USAGE)
    if usage:
        # A rank refused its configuration; ranks that failed with it were waiting on it.
        for message, ranks in usage.items():
            print(f"error: {message} ({_ranks(ranks)})", file=sys.stderr)
        return USAGE_EXIT
    stops = _recorded(failures, AGREED_STOP)
    if stops:
        # Every rank decided to stop, together. The first to exit makes the agent end the rest,
        # so a rank still tearing down reads "killed by SIGTERM" (or, on torch < 2.6, is not
        # among the failures at all): its record says it had stopped, and the line is the cause.
        for message in stops:
            print(f"error: {message}", file=sys.stderr)
        stopped = {rank for ranks in stops.values() for rank in ranks}
        failures = [(rank, failure) for rank, failure in failures if rank not in stopped]
        if not failures:
            return 1
    # Once a rank fails, the agent ends the others with SIGTERM: those are not causes, unless
    # every failure is one (a SIGTERM from outside).
    causes = [(rank, failure) for rank, failure in failures if not _ended_by_the_agent(failure)]
    described = ", ".join(_describe(rank, failure) for rank, failure in causes or failures)
    stacks_dir = os.path.join(out, "stacks")
    stacks = _stack_files(stacks_dir)
    hint = (
        f"; stacks of hung ranks in {stacks_dir}/ ({', '.join(stacks)})"
        if stacks
        else "; see the ranks' output above"
    )
    print(f"error: {job} failed: {described}{hint}", file=sys.stderr)
    return 1  # a runtime failure, whatever code or signal ended the failed rank


def _ended_by_the_agent(failure: ProcessFailure) -> bool:
    return failure.exitcode == -signal.SIGTERM


def _describe(rank: int, failure: ProcessFailure) -> str:
    if failure.exitcode < 0:
        return f"rank {rank} killed by {signal.Signals(-failure.exitcode).name}"
    return f"rank {rank} exit code {failure.exitcode}"


def _recorded(failures: list[tuple[int, ProcessFailure]], kind: str) -> dict[str, list[int]]:
    """The one-line errors of ``kind`` that ranks recorded, each with the ranks that did."""
    found: dict[str, list[int]] = {}
    for rank, failure in failures:
        if failure.error_file_data.get(KIND_KEY) == kind and isinstance(failure.message, str):
            found.setdefault(failure.message, []).append(rank)
    return found


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _stack_files(stacks_dir: str) -> list[str]:
    """Names of the stack dumps hung ranks wrote; a rank killed outright leaves an empty file."""
    if not os.path.isdir(stacks_dir):
        return []
    names = sorted(os.listdir(stacks_dir))
    return [n for n in names if os.path.getsize(os.path.join(stacks_dir, n)) > 0]
