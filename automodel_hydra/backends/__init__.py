"""Backends, imported lazily by name (TorchX's ``DEFAULT_SCHEDULER_MODULES`` pattern): planning a Slurm job
never imports ``sky``, and starting Hydra imports none of them. Each implements
:class:`automodel_hydra.plan.Backend`."""

from __future__ import annotations

import importlib
import typing as tp

if tp.TYPE_CHECKING:
    from automodel_hydra.plan import Backend

#: backend name -> "module:class"
BACKENDS = {
    "interactive": "automodel_hydra.backends.interactive:Interactive",
    "slurm": "automodel_hydra.backends.slurm:Slurm",
    "skypilot": "automodel_hydra.backends.skypilot:SkyPilot",
}


def get(name: str) -> Backend[tp.Any, tp.Any, tp.Any]:
    """A new instance of the backend called ``name``. Raises UserValueError naming the valid backends."""
    if name not in BACKENDS:
        from automodel_hydra.schema import UserValueError

        raise UserValueError(f"unknown launcher backend {name!r}; valid: {sorted(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    backend: Backend[tp.Any, tp.Any, tp.Any] = getattr(importlib.import_module(module), cls)()
    return backend
