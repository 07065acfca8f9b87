"""The run's settings: every option of ``python -m refddp.train``, read and checked
(docs/layout.md)."""
