"""A rank's one-line error, handed to refddp's launcher through torch elastic's error file.

torch's elastic agent gives each rank a file (``TORCHELASTIC_ERROR_FILE``) whose JSON it reads
back as that rank's failure, however the rank ended (killed by the agent included). refddp's
launcher prints what ranks record there, once, instead of one traceback per rank.
"""

from __future__ import annotations

import json
import os
import time

LAUNCHED_ENV = "REFDDP_LAUNCHED"  # set in every rank refddp's launcher starts
KIND_KEY = "refddp_kind"  # in a rank's error file: which of the kinds below it records
USAGE = "usage"  # a refused configuration (exit code 2)
AGREED_STOP = "agreed_stop"  # every rank decided to stop at the same point (exit code 1)


def record_error(message: str, kind: str) -> bool:
    """In a rank refddp's launcher started, hand ``message`` to the launcher to print; False
    when there is none (a single process, plain torchrun): the caller prints it itself.

    An ``AGREED_STOP`` is recorded at the decision, before any teardown: the agent ends the
    other ranks as soon as one exits, and a rank it ends must already have said it stopped.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or LAUNCHED_ENV not in os.environ:
        return False
    with open(path, "w") as f:
        json.dump({"message": message, "timestamp": int(time.time()), KIND_KEY: kind}, f)
    return True
