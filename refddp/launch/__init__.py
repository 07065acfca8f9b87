"""How ranks start, meet and end: torchrun, SLURM, the process group, stop signals, exit codes
(docs/layout.md)."""
