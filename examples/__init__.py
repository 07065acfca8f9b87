"""Real workloads for ``python -m refddp.train``, named by import path (run from the repo root)."""
