"""How ranks start, meet and end: torchrun, SLURM, the process group, stop signals, exit codes,
the host's random streams (docs/layout.md)."""
