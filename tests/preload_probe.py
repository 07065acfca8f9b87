"""A module the rank server may preload (tests/harness/test_rank_server.py): it records which
process imported it, and starts a thread at import when asked to (a module a fork is unsafe
after)."""

import os
import threading
import time

IMPORTED_IN = os.getpid()

if os.environ.get("REFDDP_TEST_PROBE_THREAD"):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
