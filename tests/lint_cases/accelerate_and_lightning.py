"""Accelerate's and Lightning's rank flags around their collectives, and a torchmetrics metric's
compute(), which gathers its states from every rank."""

import torch.distributed as dist
import torchmetrics
from accelerate import Accelerator


def accelerate_train(model, loader):
    accelerator = Accelerator()
    model, loader = accelerator.prepare(model, loader)
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()  # expect: RDL101
        accelerator.save_state("out")  # expect: RDL101
    if accelerator.process_index == 0:
        metrics = accelerator.gather_for_metrics(model)  # expect: RDL101
        print(metrics)


def lightning_hook(trainer, pl_module, t):
    if trainer.is_global_zero:
        trainer.strategy.barrier()  # expect: RDL101
    if pl_module.global_rank == 0:
        pl_module.all_gather(t)  # expect: RDL101


def torchmetrics_epoch_end(preds, target):
    accuracy = torchmetrics.Accuracy(task="binary")
    accuracy.update(preds, target)
    if trainer_is_main():
        print(accuracy.compute())  # expect: RDL101


def trainer_is_main():
    return dist.get_rank() == 0


class Agreement(torchmetrics.Metric):
    """The project's own metric: its compute() gathers the states as torchmetrics' own do."""

    def update(self, preds, target):
        pass

    def compute(self):
        return 0


def own_metric_on_rank_zero(preds, target):
    agreement = Agreement()
    agreement.update(preds, target)
    if dist.get_rank() == 0:
        print(agreement.compute())  # expect: RDL101


def explicit_sync_of_an_unsynced_metric(preds, target):
    total = torchmetrics.MeanMetric(sync_on_compute=False)
    total.update(preds)
    if dist.get_rank() == 0:
        total.sync()  # expect: RDL101 (an explicit sync() gathers whatever the flag says)
