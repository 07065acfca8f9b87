"""Every process meets; the main process alone writes and prints."""

import torch.distributed as dist
import torchmetrics
from accelerate import Accelerator


def accelerate_train(model, loader):
    accelerator = Accelerator()
    model, loader = accelerator.prepare(model, loader)
    accelerator.wait_for_everyone()
    accelerator.save_state("out")
    metrics = accelerator.gather_for_metrics(model)
    if accelerator.is_main_process:
        accelerator.print(metrics)
        accelerator.save(model, "model.pt")


def lightning_hook(trainer, pl_module, t):
    trainer.strategy.barrier()
    gathered = pl_module.all_gather(t)
    if trainer.is_global_zero:
        print(gathered)


def torchmetrics_epoch_end(preds, target):
    accuracy = torchmetrics.Accuracy(task="binary")
    accuracy.update(preds, target)
    value = accuracy.compute()  # every rank: it gathers the states
    if dist.get_rank() == 0:
        print(value)


def rank_zero_metric(preds, target):
    local = torchmetrics.Accuracy(task="binary", sync_on_compute=False)  # never gathers
    local.update(preds, target)
    if dist.get_rank() == 0:
        print(local.compute())


class Agreement(torchmetrics.Metric):
    def update(self, preds, target):
        pass

    def compute(self):
        return 0


def own_unsynced_metric_on_rank_zero(preds, target):
    agreement = Agreement(sync_on_compute=False)
    agreement.update(preds, target)
    if dist.get_rank() == 0:
        print(agreement.compute())
