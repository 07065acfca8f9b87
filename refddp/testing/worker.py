"""Rank side of the harness: one process of a pool, run as ``python -m refddp.testing.worker``.

It joins the pool's process group once, then runs tasks sent by the driver (``pool.py``) over a
private socket until told to stop or until its parent dies. The driver set this interpreter's
environment (``TORCH_DISTRIBUTED_DEBUG`` among it) before start, since torch reads it on import.

Messages, driver -> rank: ``("run", task)``, ``("stop",)``.
Rank -> driver: ``("ready",)``, ``("ok", result_bytes, health)``, ``("error", text, health)``,
``("skip", reason, health)``, ``("init_error", text)``.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib
import importlib.util
import io
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from refddp.dist import DistContext, end_process, exit_with_parent, pin_gloo_to_loopback
from refddp.testing import collectives

DRIVER_MAIN = "__refddp_driver_main__"


class _TaskUnpickler(pickle.Unpickler):
    """Resolves the driver's ``__main__`` to its script, loaded here under DRIVER_MAIN."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(DRIVER_MAIN if module == "__main__" else module, name)


def _import_test_modules(sys_path: list[str], modules: list[tuple[str, str | None]]) -> None:
    """Make the driver's modules importable here, whatever pytest's import mode."""
    sys.path[:] = sys_path + [p for p in sys.path if p not in sys_path]
    for name, file in modules:
        if name == "__main__":
            name = DRIVER_MAIN  # its `if __name__ == "__main__":` block must not run here
        current = sys.modules.get(name)
        if current is not None and getattr(current, "__file__", None) == file:
            continue
        try:
            module = importlib.import_module(name)
            if file is None or getattr(module, "__file__", None) == file:
                continue
        except ImportError:
            if file is None:
                raise
        # Not importable by name here (pytest's importlib mode, rootdir-relative names): load
        # it from its file under the name the driver pickled against.
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None, f"cannot load {file}"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def _health(ctx: DistContext) -> dict[str, Any]:
    initialized = dist.is_initialized()
    return {
        "initialized": initialized,
        "world_size": dist.get_world_size() if initialized else None,
        "sequence": collectives.process_group_sequence(),
    }


def _run_task(task: dict[str, Any], ctx: DistContext) -> tuple:
    collectives.reset_count()
    try:
        _import_test_modules(task["sys_path"], task["modules"])
        fn, args, kwargs = _TaskUnpickler(io.BytesIO(task["payload"])).load()
        kwargs = {
            k: ctx if isinstance(v, DistContext) and v.is_placeholder else v
            for k, v in kwargs.items()
        }
        result = fn(*args, **kwargs)
        payload = pickle.dumps(result)
        reply: tuple = ("ok", payload)
    except BaseException as exc:  # noqa: BLE001 - everything a test raises goes to the driver
        outcomes = sys.modules.get("_pytest.outcomes")
        if outcomes is not None and isinstance(exc, outcomes.Skipped):
            reply = ("skip", str(getattr(exc, "msg", exc)))
        else:
            reply = ("error", traceback.format_exc())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return (*reply, _health(ctx))


def _init_group(args: argparse.Namespace) -> DistContext:
    device = "cpu"
    if args.backend == "nccl":
        # The driver restricted CUDA_VISIBLE_DEVICES to this pool's leased GPUs, in rank order.
        torch.cuda.set_device(args.rank)
        device = f"cuda:{args.rank}"
    store = dist.TCPStore(  # this pool's own store: its keys are the pool's alone
        "127.0.0.1",
        args.store_port,
        is_master=False,
        timeout=datetime.timedelta(seconds=args.init_timeout),
    )
    detail = dist.get_debug_level() == dist.DebugLevel.DETAIL
    if detail:
        # Create the groups unwrapped (see collectives.py: torch's DETAIL wrapper crashes DDP
        # on gloo); our own fingerprint check takes its place. DETAIL is restored below.
        dist.set_debug_level(dist.DebugLevel.INFO)
    pin_gloo_to_loopback()  # a pool's ranks are all on this machine
    dist.init_process_group(
        args.backend,
        store=store,
        rank=args.rank,
        world_size=args.world_size,
        # Hangs are the driver's to detect (with stacks); keep torch's own timeout out of its way.
        timeout=datetime.timedelta(seconds=args.collective_timeout),
    )
    if detail:
        collectives.enable_fingerprint_check(dist.new_group(backend="gloo"))
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    return DistContext(args.rank, args.world_size, args.rank, device, args.backend)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--init-timeout", type=float, default=120.0)
    parser.add_argument("--collective-timeout", type=float, default=3600.0)
    args = parser.parse_args()

    exit_with_parent()
    stack_file = open(os.path.join(args.workdir, f"rank{args.rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    collectives.install(collectives.slot_path_for(args.workdir, args.rank))
    torch.set_num_threads(1)

    conn = Connection(args.fd)
    try:
        ctx = _init_group(args)
    except BaseException:  # noqa: BLE001
        conn.send(("init_error", traceback.format_exc()))
        return 1
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message[0] == "stop":
            break
        conn.send(_run_task(message[1], ctx))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    end_process(main)  # gloo threads DDP tests left running cannot abort the exit
