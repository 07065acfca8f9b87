"""User code the tests name as ``package.module:callable``, as a real project would."""

import os
import random
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.checkpoint

from refddp.workload.data import TensorPairDataset, synthetic


def tiny_linear(config):
    return torch.nn.Linear(config.input_dim, config.num_classes).to(getattr(torch, config.dtype))


def not_a_module(config):
    return {"weights": 1}


class WrappedDataset(torch.utils.data.Dataset):
    """A dataset over ``base`` (its length); a subclass's ``__getitem__`` adds the behaviour."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)


class RecordingDataset(WrappedDataset):
    """Appends every index it serves to ``$REFDDP_TEST_RECORD/rank<R>.txt``."""

    def __getitem__(self, index):
        rank = dist.get_rank() if dist.is_initialized() else 0
        with open(os.path.join(os.environ["REFDDP_TEST_RECORD"], f"rank{rank}.txt"), "a") as f:
            f.write(f"{index}\n")
        return self.base[index]


def recording_datasets(config):
    train, val = synthetic(config)
    return RecordingDataset(train), val


def rank_dependent_datasets(config):
    """A user bug: each rank builds a differently sized training set."""
    train, val = synthetic(config)
    keep = len(train) - 16 * (dist.get_rank() if dist.is_initialized() else 0)
    return TensorPairDataset(train.x[:keep], train.y[:keep]), val


def exploding_datasets(config):
    """One training sample in twenty is inf: some steps' loss is inf on some rank."""
    train, val = synthetic(config)
    x = train.x.clone()
    x[::20] = float("inf")
    return TensorPairDataset(x, train.y), val


def first_step_explodes_datasets(config):
    """The first sample of epoch 0's global order is inf: step 1's loss is non-finite, so the
    optimizer's first applied step is step 2 (GlobalBatchSampler's order, refddp/workload/data.py)."""
    train, val = synthetic(config)
    first = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))[0]
    x = train.x.clone()
    x[first] = float("inf")
    return TensorPairDataset(x, train.y), val


def spiky_mlp(config):
    """An MLP whose first-layer gradient is inf on rank 1 every third backward (loss stays
    finite): what an fp16 overflow looks like to GradScaler, planted before DDP's all-reduce."""
    from refddp.workload.models import MLP

    model = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
    backwards = {"n": 0}

    def spike(grad):
        backwards["n"] += 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        return (
            torch.full_like(grad, float("inf")) if rank == 1 and backwards["n"] % 3 == 0 else grad
        )

    model.net[0].weight.register_hook(spike)
    return model


def killed_mlp(config):
    """An MLP whose rank 1 (or $REFDDP_TEST_KILL_RANK) SIGKILLs itself at forward
    $REFDDP_TEST_KILL_AT (unset: never), first attempt only."""
    import signal

    from refddp.workload.models import MLP

    model = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
    forwards = {"n": 0}
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    def maybe_die(module, inputs):
        if module.training:
            forwards["n"] += 1
            if (
                dist.get_rank() == int(os.environ.get("REFDDP_TEST_KILL_RANK", "1"))
                and first_attempt
                and forwards["n"] == int(os.environ.get("REFDDP_TEST_KILL_AT", "-1"))
            ):
                os.kill(os.getpid(), signal.SIGKILL)

    model.register_forward_pre_hook(maybe_die)
    return model.to(getattr(torch, config.dtype))


class StuckDataset(WrappedDataset):
    """Rank 1 blocks forever on its 20th item: a data loader that never returns."""

    def __init__(self, base):
        super().__init__(base)
        self.served = 0

    def __getitem__(self, index):
        self.served += 1
        if dist.get_rank() == 1 and self.served == 20:
            import threading

            threading.Event().wait()
        return self.base[index]


def stuck_datasets(config):
    train, val = synthetic(config)
    return StuckDataset(train), val


class FailingDataset(WrappedDataset):
    """Raises OSError on the ``fail_at``-th item it serves (0: never): a sample file that
    cannot be read."""

    def __init__(self, base):
        super().__init__(base)
        self.served, self.fail_at = 0, 0

    def __getitem__(self, index):
        self.served += 1
        if self.served == self.fail_at:
            raise OSError(f"item {self.served}: unreadable")
        return self.base[index]


def failing_datasets(config):
    train, val = synthetic(config)
    return FailingDataset(train), val


def datasets_missing_on_rank_1(config):
    """A data file present on rank 0's node only: rank 1 alone refuses its configuration."""
    from refddp.config.schema import ConfigError

    if dist.is_initialized() and dist.get_rank() == 1:
        raise ConfigError("data: file not found: /node-local/train.pt")
    return synthetic(config)


def ignored_labels_on_rank_1(config):
    """A data pipeline that differs by rank: rank 1's training labels include -100 (ignored),
    so its loss counts scored targets, while rank 0's counts one target a sample."""
    train, val = synthetic(config)
    if dist.is_initialized() and dist.get_rank() == 1:
        y = train.y.clone()
        y[::7] = -100
        train = TensorPairDataset(train.x, y)
    return train, val


class SlowValDataset(WrappedDataset):
    """While ``$REFDDP_TEST_SLOW_EVAL`` names a directory, each item takes 50 ms and the first
    one served leaves ``evaluating`` there: an evaluation long enough to be signalled during."""

    def __getitem__(self, index):
        slow = os.environ.get("REFDDP_TEST_SLOW_EVAL")
        if slow:
            open(os.path.join(slow, "evaluating"), "a").close()
            time.sleep(0.05)  # the slowness under test, not synchronisation
        return self.base[index]


def slow_eval_datasets(config):
    train, val = synthetic(config)
    return train, SlowValDataset(val)


def native_thread_names() -> list[str]:
    """The names of this process's threads, native ones included (Linux)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            pass
    return sorted(names)


def mlp_reporting_native_threads_at_exit(config):
    """The demo MLP; at exit, each rank writes the names of its live native threads to
    ``$REFDDP_TEST_THREADS_DIR/rank<R>.txt``. Exit handlers run after the trainer's teardown,
    where a native thread still alive would run on into interpreter shutdown. (The launcher
    also builds the model, to check it, before any group exists: it reports nothing.)"""
    import atexit

    from refddp.workload.models import MLP

    def report(rank: int) -> None:
        path = os.path.join(os.environ["REFDDP_TEST_THREADS_DIR"], f"rank{rank}.txt")
        with open(path, "w") as f:
            f.write("\n".join(native_thread_names()))

    if dist.is_initialized():  # a rank; the group is gone by exit time
        atexit.register(report, dist.get_rank())
    model = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
    return model.to(getattr(torch, config.dtype))


def _tiny_gpt2_config(config):
    from transformers import GPT2Config

    # Token ids are the classes; the sequence is input_dim tokens long.
    return GPT2Config(vocab_size=config.num_classes, n_positions=config.input_dim, n_embd=16,
                      n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)  # fmt: skip


def gpt2(config):
    """A stock ``transformers.GPT2LMHeadModel`` (random init, nothing downloaded), whose
    output embedding is tied to its input embedding."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel(_tiny_gpt2_config(config)).to(getattr(torch, config.dtype))


def next_token_gpt2(config):
    """A GPT-2 (a ``transformers.PreTrainedModel``, tied embeddings) whose forward maps token
    ids to the next token's logits: the trainer's cross-entropy trains it as a classifier over
    the vocabulary (``token_datasets``)."""
    from transformers import GPT2LMHeadModel

    class NextTokenGPT2(GPT2LMHeadModel):
        def forward(self, x):
            return super().forward(input_ids=x).logits[:, -1]

    return NextTokenGPT2(_tiny_gpt2_config(config)).to(getattr(torch, config.dtype))


def token_datasets(config):
    """Sequences of ``input_dim`` token ids below ``num_classes``; the target is the first."""
    g = torch.Generator().manual_seed(config.seed)

    def make(n):
        x = torch.randint(0, config.num_classes, (n, config.input_dim), generator=g)
        return TensorPairDataset(x, x[:, 0].clone())

    return make(config.train_size), make(config.val_size)


class SlowTrainDataset(WrappedDataset):
    """While ``$REFDDP_TEST_SLOW_TRAIN`` is set, each item takes that many seconds: a run long
    enough to be signalled during, whose data (and so weights) are those of a fast one."""

    def __getitem__(self, index):
        delay = float(os.environ.get("REFDDP_TEST_SLOW_TRAIN", 0))
        if delay:
            time.sleep(delay)  # the slowness under test, not synchronisation
        return self.base[index]


def slow_train_datasets(config):
    train, val = synthetic(config)
    return SlowTrainDataset(train), val


class WorkerRandomDataset(WrappedDataset):
    """Noise from Python's and numpy's RNGs: in loader workers, only their seeds set it."""

    def __getitem__(self, index):
        x, y = self.base[index]
        return x + random.gauss(0.0, 0.1) + float(np.random.normal(0.0, 0.1)), y


def worker_random_datasets(config):
    train, val = synthetic(config)
    return WorkerRandomDataset(train), val


def host_draws_datasets(config):
    """The synthetic data; first, in a rank's process (not the launcher's check of the
    data), this rank's first draws from Python's and numpy's RNGs, as a dataset built there
    would draw them, written to ``$REFDDP_TEST_DRAWS/rank<RANK>.txt``."""
    if "RANK" in os.environ:
        path = os.path.join(os.environ["REFDDP_TEST_DRAWS"], f"rank{os.environ['RANK']}.txt")
        with open(path, "w") as f:
            f.write(f"{random.random()!r} {float(np.random.rand())!r}\n")
    return synthetic(config)


MARK = 1234.0  # the first feature of the one training sample ``marked_datasets`` marks


def marked_datasets(config):
    """The synthetic data, with training sample 10's first feature set to ``MARK``: the losses
    below misbehave on that sample only, so on one rank at one step, wherever the sampler
    puts it (and whatever state a warm rank process carries from earlier tests)."""
    train, val = synthetic(config)
    x = train.x.clone()
    x[10, 0] = MARK
    return TensorPairDataset(x, train.y), val


def _marked(batch):
    x, _ = batch
    return x[:, 0] == MARK


def nan_gradient_loss(outputs, batch):
    """Cross-entropy summed over the batch, plus, for the marked sample, a distance between
    its output and a detached copy of it: 0 in value, 0/0 (NaN) in gradient. The loss stays
    finite; the gradient does not."""
    _, y = batch
    total = torch.nn.functional.cross_entropy(outputs, y, reduction="sum")
    marked = outputs[_marked(batch)]
    return total + ((marked - marked.detach()) ** 2).sum().sqrt(), (y != -100).sum()


def infinite_loss_finite_gradient_loss(outputs, batch):
    """Cross-entropy summed over the batch, with the marked sample's target logit masked to
    -inf: its loss is inf, yet every gradient is finite (softmax minus the one-hot target)."""
    _, y = batch
    target = torch.nn.functional.one_hot(y, outputs.shape[-1]).bool()
    masked = outputs.masked_fill(target & _marked(batch)[:, None], float("-inf"))
    return torch.nn.functional.cross_entropy(masked, y, reduction="sum"), (y != -100).sum()


class CheckpointedMLP(torch.nn.Module):
    """An MLP whose hidden layers run under activation (gradient) checkpointing: their
    activations are recomputed in the backward, as memory-bound users train."""

    def __init__(self, config):
        super().__init__()
        width = config.hidden_size
        self.inp = torch.nn.Linear(config.input_dim, width)
        self.hidden = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                          torch.nn.Linear(width, width), torch.nn.Tanh())  # fmt: skip
        self.out = torch.nn.Linear(width, config.num_classes)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.utils.checkpoint.checkpoint(self.hidden, h, use_reentrant=False)
        return self.out(h)


def checkpointed_mlp(config):
    return CheckpointedMLP(config).to(getattr(torch, config.dtype))



def nan_gradient_every_step_loss(outputs, batch):
    """Cross-entropy summed over the batch plus a distance between the outputs and a detached
    copy of them: finite (0 added) in value, NaN (0/0) in gradient, at every step, on every
    rank: a run that can train nothing."""
    _, y = batch
    total = torch.nn.functional.cross_entropy(outputs, y, reduction="sum")
    return total + ((outputs - outputs.detach()) ** 2).sum().sqrt(), (y != -100).sum()


def huge_gradient_loss(outputs, batch):
    """Cross-entropy summed over the batch, times 1e30: finite in float32, and so is each
    gradient, but their 2-norm overflows float32 (its squares pass 3.4e38)."""
    total, count = plain_cross_entropy_sum(outputs, batch)
    return total * 1e30, count


_training_losses = 0  # this process's training loss calls: nan_gradient_from_step_7_loss


def nan_gradient_from_step_7_loss(outputs, batch):
    """``nan_gradient_every_step_loss`` from the 7th training loss on: a run of one micro-batch
    a step at 1 or 2 DDP ranks trains its first 6 steps, then skips every one to its end (it
    counts calls: at 3+ ranks the trainer's settling backward makes one more, and
    accumulation one a micro-batch)."""
    global _training_losses
    if not torch.is_grad_enabled():  # an evaluation
        return plain_cross_entropy_sum(outputs, batch)
    _training_losses += 1
    if _training_losses < 7:
        return plain_cross_entropy_sum(outputs, batch)
    return nan_gradient_every_step_loss(outputs, batch)


def plain_cross_entropy_sum(outputs, batch):
    _, y = batch
    return torch.nn.functional.cross_entropy(outputs, y, reduction="sum"), (y != -100).sum()


class ExpertBias(torch.nn.Module):
    def __init__(self, size):
        super().__init__()
        self.value = torch.nn.Parameter(torch.zeros(size))


class ExpertMLP(torch.nn.Module):
    """An MLP plus a per-rank expert bias that DDP is told to leave alone (what tensor- and
    expert-parallel code does with ``_ddp_params_and_buffers_to_ignore``; in a sub-module: DDP
    ignores no top-level parameter, whatever the list says). On rank ``$REFDDP_TEST_BAD_RANK``
    (default 1), the ``$REFDDP_TEST_BAD_FORWARD``-th training forward (default 3; 0: every
    one) makes the expert's gradient NaN behind a finite loss: a non-finite gradient that
    DDP's all-reduce never carries to the other ranks."""

    def __init__(self, config):
        super().__init__()
        from refddp.workload.models import MLP

        self.mlp = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
        self.expert = ExpertBias(config.num_classes)
        self.forwards = 0

    def forward(self, x):
        expert = self.expert.value
        out = self.mlp(x) + expert
        if self.training:
            self.forwards += 1
            rank = dist.get_rank() if dist.is_initialized() else 0
            at = int(os.environ.get("REFDDP_TEST_BAD_FORWARD", "3"))
            if rank == int(os.environ.get("REFDDP_TEST_BAD_RANK", "1")) and at in (0, self.forwards):
                out = out + ((expert - expert.detach()) ** 2).sum().sqrt()
        return out


class OffsetMLP(torch.nn.Module):
    """An MLP plus an offset per class, whose first element's gradient is NaN behind a finite
    loss at the 3rd training forward, on every rank. FSDP shards the offset along its only
    dimension, so only rank 0's shard holds that NaN: the other ranks see finite gradients."""

    def __init__(self, config):
        super().__init__()
        from refddp.workload.models import MLP

        self.mlp = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
        self.offset = torch.nn.Parameter(torch.zeros(config.num_classes))
        self.forwards = 0

    def forward(self, x):
        out = self.mlp(x) + self.offset
        if self.training:
            self.forwards += 1
            if self.forwards == 3:
                first = self.offset[0]
                out = out + ((first - first.detach()) ** 2).sqrt()
        return out


def offset_mlp(config):
    return OffsetMLP(config).to(getattr(torch, config.dtype))


def expert_mlp(config):
    model = ExpertMLP(config).to(getattr(torch, config.dtype))
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, ["expert.value"]
    )
    return model


def nonfinite_val_datasets(config):
    """Finite training data; one validation sample is inf: the evaluation is non-finite."""
    train, val = synthetic(config)
    x = val.x.clone()
    x[0] = float("inf")
    return train, TensorPairDataset(x, val.y)


def mlp_with_an_unused_head(config):
    """The MLP with a second head its forward never uses: its parameters get no gradient."""
    from refddp.workload.models import MLP

    model = MLP(config.input_dim, config.hidden_size, config.depth, config.num_classes)
    model.unused_head = torch.nn.Linear(config.hidden_size, 3)
    return model


class _KeyedBy(torch.utils.data.Dataset):
    """A dataset that holds a local lambda: pickle refuses it."""

    def __init__(self, data):
        self.data, self.key = data, lambda i: i

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[self.key(i)]


def unpicklable_datasets(config):
    """Training data that does not pickle: loader workers started by spawn or forkserver
    cannot get it."""
    train, val = synthetic(config)
    return _KeyedBy(train), val
