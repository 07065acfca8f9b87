"""Where rank processes come from: forked from a server that imported torch once.

A rank's start used to be mostly ``import torch`` (a second or more of CPU each, so 8 ranks on 2
cores took seconds). The driver now starts one server per process (``python -m
refddp.testing.driver.rank_server``, on the first pool) that imports torch, ``torch.distributed``,
the harness's rank code and the modules asked for (``--dist-preload``), and then only forks: what it
imported is shared by every rank, not imported by each. The fork happens before any rank code runs,
and the server never touches CUDA (it checks, and refuses to fork once CUDA is initialised, or once
a preloaded module started a thread), so NCCL ranks stay CUDA-safe: each child initialises CUDA
itself, as a fresh interpreter would. Coverage is not started in the server; each child starts it
from the pool's settings, so lines that ranks run are counted as before.

Each rank is forked through a short-lived intermediate that exits at once, so the rank is
re-parented to the driver, which is a child subreaper (Linux) for that moment only: the driver
waits on its ranks like on its own children, exit codes and signals included, and a rank's
``exit_with_parent`` watches the driver. Without ``prctl`` (not Linux) ranks start as fresh
interpreters, as before.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_MAX_MESSAGE = 1 << 20
# Environment entries the server must not start with: coverage would measure the server and
# every fork would inherit its tracer; each rank starts coverage itself from the pool's env.
_NOT_FOR_THE_SERVER = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
# The worker too: its modules, imported once here, stay shared pages in every rank (imported in
# each rank after the fork they cost ~6 MB a rank: 6 GB at 1,024 ranks).
PRELOADED = ("torch", "torch.distributed", "torch.nn", "refddp.testing.rank.worker")
# More modules for the server to import once (comma-separated; pytest's --dist-preload): at
# hundreds of ranks, each rank importing the test module's dependencies (a trainer, a model
# library) is most of a pool's start and memory. Imported with the driver's sys.path.
PRELOAD_ENV, _PRELOAD_PATH_ENV = "REFDDP_PRELOAD", "REFDDP_PRELOAD_PATH"
preload: list[str] = []  # more, from this process (the plugin's option): the server's alone
HANDSHAKE_TIMEOUT_S = 300.0  # for the server's imports (a preloaded module may hang)


class RankProcess:
    """A rank this process started, as ``subprocess.Popen`` shows one: pid, poll, wait, kill."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:  # Popen.wait with a timeout polls the same way
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now (Linux; False elsewhere)."""
    flag = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return bool(flag.value)


class RankServer:
    """The driver's handle on its server: ``start_rank`` forks one rank there."""

    def __init__(self) -> None:
        if not _set_subreaper(False):
            raise OSError("cannot become a child subreaper (prctl): not Linux")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_THE_SERVER}
        # One thread: numpy's OpenBLAS (imported by torch) otherwise starts a pool of threads,
        # and a fork of a multi-threaded process may copy a lock another thread held. Ranks
        # run one intra-op thread anyway (worker.py).
        for threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[threads] = "1"
        env[_PRELOAD_PATH_ENV] = os.pathsep.join(sys.path)
        asked = [*os.environ.get(PRELOAD_ENV, "").split(","), *preload]
        env[PRELOAD_ENV] = ",".join(dict.fromkeys(name.strip() for name in asked if name.strip()))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refddp.testing.driver.rank_server", str(theirs.fileno())],
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
        # The server answers once its imports are done; a timeout (OSError) or an interruption
        # stops it there (``_call``), and the pool's ranks start afresh.
        self._call(None)
        self.sock.settimeout(None)

    def _call(self, request: Any, fds: Sequence[int] = ()) -> Any:
        try:
            socket.send_fds(self.sock, [pickle.dumps(request)], list(fds))
            data = self.sock.recv(_MAX_MESSAGE)
        except BaseException:
            # Cut short (Ctrl-C, a deadline's exception): the reply, if it came later, would
            # answer the next request, so this server is given up (a new one starts).
            self.proc.kill()
            self.proc.wait()
            self.sock.close()
            raise
        if not data:
            raise OSError(f"the rank server exited ({self.proc.wait()})")
        reply = pickle.loads(data)
        if isinstance(reply, str):
            raise OSError(f"the rank server refused: {reply}")
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start_rank(
        self, argv: list[str], env: dict[str, str], out_path: str, fd: int
    ) -> RankProcess:
        """Fork a rank that runs ``refddp.testing.rank.worker`` with ``argv`` (less ``--fd``),
        environment ``env``, output to ``out_path``, talking to the driver on ``fd``."""
        # A subreaper only while the rank is re-parented: a process a test orphans later goes
        # to init as usual, instead of lingering here as a zombie.
        _set_subreaper(True)
        try:
            return RankProcess(self._call((argv, env, out_path), [fd]))
        finally:
            _set_subreaper(False)

    def close(self) -> None:
        self.sock.close()  # the server exits on EOF
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_interpreter(argv: list[str], env: dict[str, str], out_path: str, fd: int) -> Any:
    """A rank as a fresh interpreter (where the rank server cannot fork one)."""
    with open(out_path, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "refddp.testing.rank.worker", "--fd", str(fd), *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
            start_new_session=True,
        )


_server: RankServer | None = None


def server() -> RankServer | None:
    """This process's rank server, started on first use; None where ranks cannot be forked."""
    global _server
    if _server is None or not _server.alive():
        try:
            _server = RankServer()
        except OSError:
            return None
    return _server


def shutdown_server() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None


# -- the server process ------------------------------------------------------------------------


def _fork_rank(request: tuple, fd: int, sock: socket.socket) -> int:
    """Fork ``request``'s rank through an intermediate that exits at once; its pid."""
    import torch

    if torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
        raise RuntimeError("CUDA was initialised in the rank server")
    if _has_other_threads():  # a fork copies locks other threads may hold
        raise RuntimeError("a module the rank server preloaded started a thread")
    go_r, go_w = os.pipe()
    pid_r, pid_w = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        try:
            rank = os.fork()
            if rank == 0:
                os.close(go_w)
                os.close(pid_r)
                os.close(pid_w)
                sock.close()
                os.read(go_r, 1)  # until the server saw the intermediate exit: re-parented
                os.close(go_r)
                _become_rank(*request, fd=fd)
            os.write(pid_w, str(rank).encode())
        finally:
            os._exit(0)
    os.close(pid_w)
    os.close(go_r)
    pid = int(os.read(pid_r, 32) or b"-1")
    os.close(pid_r)
    os.waitpid(intermediate, 0)
    os.write(go_w, b"g")
    os.close(go_w)
    return pid


def _become_rank(argv: list[str], env: dict[str, str], out_path: str, fd: int) -> None:
    """In the forked child: the rank's session, output and environment, then the worker."""
    code = 1
    try:
        os.setsid()
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 16)
        os.environ.clear()
        os.environ.update(env)
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # read at import, in the server, from its environment
        argv = ["--fd", str(fd), *argv]
        sys.argv = ["refddp.testing.rank.worker", *argv]
        from refddp.testing.rank import worker

        worker.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a bug here: show it in the rank's output
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _preload(names: str, path: str) -> None:
    """Import the user's preload modules; one that fails to import is left to the ranks (each
    imports what its task needs anyway), with one line saying why."""
    import importlib

    sys.path[:0] = [p for p in path.split(os.pathsep) if p and p not in sys.path]
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the ranks import it themselves
            print(f"refddp rank server: not preloaded {name}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)  # fmt: skip
        if _has_other_threads():
            print(f"refddp rank server: preloading {name} started a thread; forking is unsafe "
                  "now, so ranks start as fresh interpreters", file=sys.stderr)  # fmt: skip
            return


def _has_other_threads() -> bool:
    """Whether a thread besides this one runs here (Linux: one entry per thread)."""
    return len(os.listdir("/proc/self/task")) > 1


def serve(fd: int) -> None:
    """Import torch once, then fork a rank for each request until the driver goes away."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    _preload(os.environ.get(PRELOAD_ENV, ""), os.environ.get(_PRELOAD_PATH_ENV, ""))
    sock = socket.socket(fileno=fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 1)
        except OSError:
            break
        if not data:
            break  # the driver closed its end, or died
        request = pickle.loads(data)
        if request is None:
            sock.send(pickle.dumps(os.getpid()))
            continue
        try:
            reply: Any = _fork_rank(request, fds[0], sock)
        except Exception as exc:  # noqa: BLE001 - told to the driver, which falls back
            reply = f"{type(exc).__name__}: {exc}"
        finally:
            for received in fds:
                os.close(received)
        sock.send(pickle.dumps(reply))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
