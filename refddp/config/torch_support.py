"""Which torch refddp runs on, and the one line that names the version a feature needs.

refddp supports torch ``FLOOR`` and newer (``docs/torch-versions.md`` says which versions were
tested and why the floor is where it is). Features that arrived later are detected where they
are used; asking for one on an older torch is refused in one line naming the version it needs.
"""

from __future__ import annotations

import torch

FLOOR = (2, 5)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the torch that is imported: ``2.5.0+cu124`` is (2, 5)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def too_old(what: str, needs: tuple[int, int]) -> str | None:
    """None where this torch is ``needs`` or newer, else the line refusing ``what``."""
    if torch_version() >= needs:
        return None
    return f"{what} needs torch >= {needs[0]}.{needs[1]}; this is torch {torch.__version__}"


def fsdp2_refused() -> str | None:
    """FSDP2's ``fully_shard`` is public in ``torch.distributed.fsdp`` from torch 2.6 (before,
    only under a private module, which refddp does not use)."""
    import torch.distributed.fsdp as fsdp

    if hasattr(fsdp, "fully_shard") and hasattr(fsdp, "FSDPModule"):
        return None
    return too_old("strategy fsdp (torch.distributed.fsdp.fully_shard)", (2, 6)) or (
        f"strategy fsdp: this torch ({torch.__version__}) has no torch.distributed.fsdp.fully_shard"
    )


def floor_refused() -> str | None:
    """The line for a torch older than refddp supports, or None."""
    return too_old("refddp", FLOOR)
