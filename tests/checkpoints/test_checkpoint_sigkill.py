"""A process SIGKILLed in the middle of writing a checkpoint leaves the previous one loadable.

Not a raised exception (which the writer's own cleanup could handle): the process dies at once,
mid-way through torch.save's bytes, and nothing of refddp runs after that.
"""

import signal
import subprocess
import sys
import textwrap

import torch

from refddp.checkpoints import loading as ckpt
from refddp.checkpoints.full import LATEST
from refddp.config.schema import TrainConfig

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from refddp.checkpoints.full import write_checkpoint
    from refddp.config.schema import TrainConfig

    def state(value):
        return {"model_state_dict": {"w": torch.full((1 << 20,), value)},
                "optimizer_state_dict": {}, "scaler_state_dict": {}, "epoch": 0,
                "step": int(value), "world_size": 1, "config": TrainConfig().to_dict(),
                "metrics": {}}

    out = sys.argv[1]
    write_checkpoint(state(1.0), out, is_best=False)
    real_save = torch.save

    class DiesHalfWay:
        # The file refddp writes into; SIGKILLs this process once half the bytes are out.
        def __init__(self, f):
            self.f, self.written = f, 0
        def write(self, data):
            self.written += len(data)
            n = self.f.write(data)
            if self.written > 2 << 20:  # the tensor is 4 MiB
                self.f.flush()  # what reached the file stays there after the kill
                os.kill(os.getpid(), signal.SIGKILL)
            return n
        def __getattr__(self, name):
            return getattr(self.f, name)

    torch.save = lambda obj, f, *a, **k: real_save(obj, DiesHalfWay(f), *a, **k)
    write_checkpoint(state(2.0), out, is_best=False)
    print("the write finished: it was not killed")
    """
)


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    latest = tmp_path / "checkpoints" / LATEST
    state = ckpt.load_checkpoint(str(latest))  # complete, not half of the second write
    assert state["step"] == 1 and torch.equal(state["model_state_dict"]["w"][:3], torch.ones(3))
    resumed = ckpt.load_resume_checkpoint(TrainConfig(out=str(tmp_path)))
    assert resumed is not None and resumed[1]["step"] == 1
