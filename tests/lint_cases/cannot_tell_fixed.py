"""The same calls, resolved: the lint sees what each one runs."""

import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def write_summary(path):
    with open(path, "w") as f:
        f.write("ok")


HOOKS = {"summary": write_summary}


def on_rank0(path):
    if dist.get_rank() == 0:
        write_summary(path)
        HOOKS["summary"](path)  # refddp: ignore[RDL201] (a table of local writers, reviewed)
        log.info("done")
