"""Shared fixtures. The real Slurm test cluster comes from tests/slurm_cluster.py (session-scoped)."""

pytest_plugins = ["tests.slurm_cluster"]
