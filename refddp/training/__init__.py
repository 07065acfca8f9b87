"""The run: the loop, the step, DDP or FSDP2, evaluation, measurements and trackers
(docs/layout.md)."""
