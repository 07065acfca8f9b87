"""``python -m refddp.convert_checkpoint DCP_DIR OUT.pth``: a sharded (``--ckpt-format dcp``)
checkpoint as the plain file of the full format.

One process, no process group, any world size the checkpoint was written at. The output is
the dict a ``checkpoint_latest.pth`` of the same run holds (same keys, same tensors): it opens
with ``torch.load(weights_only=True)``, a bare ``refddp.build_model(config)`` loads its
``model_state_dict``, and ``--resume`` / ``--init-from`` accept it. Nothing in the input runs
code (``refddp.checkpoints.dcp``). The reading is
``refddp.checkpoints.loading.load_full_checkpoint``, which takes a checkpoint of any format.

Exit codes: 0 written; 2 bad arguments or input (one line naming the path); 1 the output
could not be written (one line naming it).
"""

from __future__ import annotations

import argparse
import os
import sys

from refddp.checkpoints import formats as checkpoint_formats
from refddp.checkpoints.loading import load_full_checkpoint
from refddp.checkpoints.run_files import RunFileError, save_atomic
from refddp.config.schema import ConfigError

EXIT_USAGE, EXIT_RUNTIME = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        raise ConfigError(message)


def convert(source: str, target: str) -> None:
    """Read the dcp checkpoint ``source`` whole and write it to ``target`` atomically."""
    if not os.path.exists(source):
        raise ConfigError(f"{source}: not found")
    if checkpoint_formats.owning(source) is checkpoint_formats.plain():
        raise ConfigError(f"{source}: not a dcp checkpoint (not a directory)")
    if not target.endswith((".pt", ".pth")):
        raise ConfigError(f"{target}: the output must be a .pt or .pth file")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        above = parent  # the nearest path above the output that exists: a file, or nothing
        while not os.path.exists(above) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if os.path.isfile(above):
            raise ConfigError(f"{target}: {above} is a file")
        raise ConfigError(f"{target}: directory {parent} does not exist")
    save_atomic(load_full_checkpoint(source), target)


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = _Parser(prog="python -m refddp.convert_checkpoint", description=summary)
    parser.add_argument("dcp_dir", help="a dcp checkpoint directory (e.g. checkpoint_latest.dcp)")
    parser.add_argument("out", help="the plain checkpoint file to write (.pth)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        convert(args.dcp_dir, args.out)
    except ConfigError as exc:  # CheckpointError too: bad input
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
