"""The harness's rank side: one process of a pool, and what it runs for a test."""
