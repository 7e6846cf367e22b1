"""Backends, imported lazily by name (TorchX's ``DEFAULT_SCHEDULER_MODULES`` pattern): planning a Slurm job
never imports ``sky``, and starting Hydra imports none of them.

Each backend module has the same shape; see :mod:`automodel_hydra.plan`."""

from __future__ import annotations

import importlib
import types

BACKENDS = {
    "interactive": "automodel_hydra.backends.interactive",
    "slurm": "automodel_hydra.backends.slurm",
    "skypilot": "automodel_hydra.backends.skypilot",
}


def get(name: str) -> types.ModuleType:
    """The backend module called ``name``. Raises ValueError naming the valid backends."""
    if name not in BACKENDS:
        raise ValueError(f"unknown launcher backend {name!r}; valid: {sorted(BACKENDS)}")
    return importlib.import_module(BACKENDS[name])
