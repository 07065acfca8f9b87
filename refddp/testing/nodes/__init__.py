"""Nodes for multi-node tests: simulated on one machine, or real (network namespaces)."""
