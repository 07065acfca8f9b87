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
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from refddp.dist import loopback_store

LOOPBACK_BACKEND = "refddp-loopback"
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
    config, cmd, cmd_args = config_from_args(parse_args(torchrun_args(module, nproc, max_restarts)))
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as exc:
        return _report_failure(exc, out, job)
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        print(f"stopped by {name}; rerun the same command to resume", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


def _report_failure(exc: ChildFailedError, out: str, job: str) -> int:
    codes = {rank: f.exitcode for rank, f in exc.failures.items()}
    if all(code == 2 for code in codes.values()):
        return 2  # a user error: the ranks already printed it in one line
    stacks_dir = os.path.join(out, "stacks")
    stacks = sorted(os.listdir(stacks_dir)) if os.path.isdir(stacks_dir) else []
    described = ", ".join(
        f"rank {r} " + (f"killed by {signal.Signals(-c).name}" if c < 0 else f"exit code {c}")
        for r, c in sorted(codes.items())
    )
    hint = f"; stacks of hung ranks in {stacks_dir}/" if stacks else "; see the ranks' output above"
    print(f"error: {job} failed: {described}{hint}", file=sys.stderr)
    first = next(iter(codes.values()))
    return first if first > 0 else 1
