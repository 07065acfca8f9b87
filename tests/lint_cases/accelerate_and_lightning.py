"""Accelerate's and Lightning's rank flags around their collectives."""

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
