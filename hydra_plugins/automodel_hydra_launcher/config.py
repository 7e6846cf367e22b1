"""Hydra registrations of automodel-hydra (Hydra imports this module when it scans ``hydra_plugins``):
the launcher ``hydra/launcher=automodel``, the sweeper ``hydra/sweeper=automodel_basic`` and the recipe schema
``llm_finetune_schema``.

The job's own sections (``interactive:``, ``slurm:``, ``skypilot:``) hold every option, so a sweep can vary them
and each job routes by its own sections; the launcher node only names the launcher class."""

import typing as tp
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from automodel_hydra.backends.interactive_config import InteractiveConfig
from automodel_hydra.backends.slurm_config import CALL_DEFAULTS, SlurmConfig
from automodel_hydra.config import register


@dataclass
class SweepPolicyConf:
    # stop the sweep after this many members failed for good (a member requeued under its failure budget counts
    # once its last attempt fails): those not started yet are cancelled, running ones finish,
    # `automodel-hydra resume DIR` runs them again later; null = never stop (automodel_hydra/sweep_policy.py)
    max_failures: tp.Optional[int] = None


@dataclass
class AutomodelLauncherConf:
    _target_: str = "hydra_plugins.automodel_hydra_launcher.launcher.AutomodelLauncher"
    # only for a task function not declared @automodel_hydra.driver.launchable (any Hydra app): each job runs as
    # one process on this backend, interactive (here) or slurm (one sbatch job of one task); null = interactive.
    # train.py's jobs choose theirs with launcher=... and their own sections, and leave these at their defaults.
    backend: tp.Optional[str] = None
    # that backend's options: the schema of train.py's interactive: / slurm: section, one process per job
    interactive: InteractiveConfig = field(default_factory=InteractiveConfig)
    slurm: SlurmConfig = field(default_factory=lambda: SlurmConfig(**CALL_DEFAULTS))
    # for every sweep, whatever its task function
    sweep_policy: SweepPolicyConf = field(default_factory=SweepPolicyConf)


@dataclass
class AutomodelSweeperConf:
    """``hydra/sweeper=automodel_basic``: Hydra's basic sweep, each job composed once under our launcher."""

    _target_: str = "hydra_plugins.automodel_hydra_launcher.sweeper.AutomodelSweeper"
    # jobs per launcher call; null = all jobs in one call
    max_batch_size: int | None = None
    # sweep overrides placed before the command line's, e.g. {optim.lr: "1e-4,3e-4"}
    params: dict[str, str] | None = None


cs = ConfigStore.instance()
cs.store(group="hydra/launcher", name="automodel", node=AutomodelLauncherConf, provider="automodel_hydra")
cs.store(group="hydra/sweeper", name="automodel_basic", node=AutomodelSweeperConf, provider="automodel_hydra")
register()
