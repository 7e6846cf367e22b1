"""The Hydra launcher of automodel-hydra, thin as Hydra's joblib/ray launchers are: it stores the context and
delegates ``launch`` to ``_core``, which Hydra's plugin scanner never imports (leading underscore), so starting
Hydra stays fast."""

from __future__ import annotations

import typing as tp

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class AutomodelLauncher(Launcher):
    """Prepares every job of a sweep, then runs them together on the backend each job's config routes to
    (torchrun here, a Slurm job array, SkyPilot tasks)."""

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
