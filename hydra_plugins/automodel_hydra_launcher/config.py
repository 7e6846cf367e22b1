"""Hydra launcher configs: ``hydra/launcher=automodel_{interactive,slurm,skypilot}``.

The job's own sections (``interactive:``, ``slurm:``, ``skypilot:``) hold every option, so a sweep can vary them;
these nodes only name the launcher class. ``launcher=slurm`` selects both."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

_PKG = "hydra_plugins.automodel_hydra_launcher.launchers"


@dataclass
class InteractiveLauncherConf:
    _target_: str = f"{_PKG}.InteractiveLauncher"


@dataclass
class SlurmLauncherConf:
    _target_: str = f"{_PKG}.SlurmLauncher"


@dataclass
class SkyPilotLauncherConf:
    _target_: str = f"{_PKG}.SkyPilotLauncher"


@dataclass
class AutomodelSweeperConf:
    """``hydra/sweeper=automodel_basic``: Hydra's basic sweep, each job composed once under our launchers."""

    _target_: str = "hydra_plugins.automodel_hydra_launcher.sweeper.AutomodelSweeper"
    # jobs per launcher call; null = all jobs in one call
    max_batch_size: int | None = None
    # sweep overrides placed before the command line's, e.g. {optim.lr: "1e-4,3e-4"}
    params: dict[str, str] | None = None


cs = ConfigStore.instance()
for _name, _node in (("automodel_interactive", InteractiveLauncherConf), ("automodel_slurm", SlurmLauncherConf),
                     ("automodel_skypilot", SkyPilotLauncherConf)):
    cs.store(group="hydra/launcher", name=_name, node=_node, provider="automodel_hydra")
cs.store(group="hydra/sweeper", name="automodel_basic", node=AutomodelSweeperConf, provider="automodel_hydra")
