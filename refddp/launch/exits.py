"""How a rank process ends: with its exit code and never in a native abort (``end_process``),
and, where gloo lost a peer mid-collective, with one line naming the peer's node (``lost_peer``).

Leaving the process group itself (``teardown``) is ``refddp/launch/dist.py``'s: it owns the
group it made.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from refddp.launch.dist import ends_unfinalized, rank


def end_process(main: Callable[[], int]) -> NoReturn:
    """Run a rank's ``main`` and end the process with its exit code, never in a native abort.

    ``teardown`` stops gloo's threads (see the import of ``torch.distributed.nn.functional`` in
    ``refddp/launch/dist.py``, and ``teardown`` itself, for what used to keep them alive after a
    run). This is the second line of defence, for the paths where that cannot be guaranteed: a rank
    that fails while a collective is in flight, a group a user's code keeps, a user's thread. A
    native thread still running while the interpreter finalizes can abort a finished run (SIGABRT).
    So: run the exit handlers and flush while the interpreter is whole, then leave without
    finalization; the kernel stops every thread at once. An uncaught exception is printed and exits
    1, like Python would.
    """
    ends_unfinalized()  # teardown may leave a group that can hang (torch < 2.8) to the exit
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once, as a signal would
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - a bug keeps its traceback
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # e.g. coverage saving its data: they need a whole interpreter
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# gloo's words for a peer gone mid-collective, and the peer's address: "[.../gloo/transport/
# tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:5279", "Connection reset by peer", ...
_LOST_PEER = re.compile(
    r"gloo/transport/\S*\] "
    r"(Connection closed by peer|Connection reset by peer|Read error|Write error)"
    r"[^\[\n]*\[([0-9A-Fa-f.:]+)\]:\d+"
)


def _host_in_hosts_file(address: str, path: str = "/etc/hosts") -> str | None:
    """The first name ``path`` gives ``address``. No DNS: a reverse lookup may wait for a
    resolver that the failure itself cut off."""
    try:
        with open(path) as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                if len(fields) > 1 and fields[0] == address:
                    return fields[1]
    except OSError:
        pass
    return None


def lost_peer(exc: BaseException) -> str | None:
    """One line for a collective that failed because gloo lost a peer, naming its node by the
    host name ``/etc/hosts`` gives its address (gloo names only the address); None for any
    other error."""
    seen: BaseException | None = exc
    while seen is not None:
        found = _LOST_PEER.search(str(seen))
        if found:
            how, address = found.group(1), found.group(2)
            name = _host_in_hosts_file(address)
            node = f"{name} ({address})" if name else address
            return (
                f"rank {rank()}: lost the connection to {node} in a collective "
                f"({how[0].lower() + how[1:]}): the ranks there died, its link failed, or "
                "they stopped after losing another node; every rank stops, and a rerun "
                "resumes from the last checkpoint"
            )
        seen = seen.__cause__ or seen.__context__
    return None
