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
        #: each launched job's final state (None: not waited for), over every batch: the sweep's last line
        self.job_states: list[tp.Any] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        from . import _core

        _core._max_failures(config)  # a bad value: one line before the sweeper writes the sweep dir

    def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> tp.Sequence[JobReturn]:
        from . import _core

        return _core.launch(self, job_overrides, initial_job_idx)
