"""Repo-only test set-up. The harness itself (spawn, dist_ctx, markers) comes from the
refddp pytest plugin, loaded through its entry point."""

pytest_plugins = ["pytester"]
