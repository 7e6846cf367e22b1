"""Thin Hydra launchers (Hydra's joblib/ray pattern): store the context, delegate ``launch`` to ``_core``, which
Hydra's plugin scanner never imports (leading underscore) so starting Hydra stays fast."""

from __future__ import annotations

import typing as tp

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class AutomodelLauncher(Launcher):
    """Plans every job of a sweep, then runs them together on the backend each job's config routes to."""

    backend = "interactive"

    def __init__(self, **params: tp.Any) -> None:
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> tp.Sequence[JobReturn]:
        from . import _core

        return _core.launch(self, job_overrides, initial_job_idx)


class InteractiveLauncher(AutomodelLauncher):
    """torchrun on this node; sweep jobs packed onto free devices."""


class SlurmLauncher(AutomodelLauncher):
    """Slurm via submitit; a sweep becomes one job array per set of shared options."""

    backend = "slurm"


class SkyPilotLauncher(AutomodelLauncher):
    """SkyPilot; one task (a managed job when use_spot) per sweep point."""

    backend = "skypilot"
